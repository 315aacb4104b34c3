"""A batched CartPole-v1 in torch: gymnasium's dynamics, termination and 500-step time limit.

Every environment of the batch ``[*B]`` is one ``gymnasium.make("CartPole-v1")``: Euler
integration with ``tau = 0.02``, a push of +-10 N, termination when ``|x| > 2.4`` or
``|theta| > 12 degrees``, reward 1 on every step (the terminating one included) and
truncation after 500 steps. The state is kept in float64 (as gymnasium does) and observed in
float32. The functions are pure and tensor-only, so they step thousands of environments in a
few vectorised ops and trace into a ``torch.compile`` graph together with the policy.
``tests/test_ppo_example.py`` checks them step for step against gymnasium.
"""

from __future__ import annotations

import math

import torch

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_CART + MASS_POLE
HALF_LENGTH = 0.5  # gymnasium's ``length``: half the pole's length
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
FORCE = 10.0
TAU = 0.02
X_LIMIT = 2.4
THETA_LIMIT = 12 * 2 * math.pi / 360
MAX_STEPS = 500  # CartPole-v1's TimeLimit
RESET_BOUND = 0.05  # initial state uniform in [-0.05, 0.05]^4


def initial_state(shape: tuple[int, ...], generator: torch.Generator | None = None) -> torch.Tensor:
    """Fresh states ``[*shape, 4]`` (float64): ``(x, x_dot, theta, theta_dot)`` uniform in +-0.05."""
    noise = torch.rand(*shape, 4, dtype=torch.float64, generator=generator)
    return (2 * noise - 1) * RESET_BOUND


def step(state: torch.Tensor, steps: torch.Tensor, action: torch.Tensor):
    """One step of every environment.

    Args:
        state: ``[*B, 4]`` float64, ``(x, x_dot, theta, theta_dot)``.
        steps: ``[*B]`` int, steps taken since the episode started.
        action: ``[*B]`` int or bool, 1 pushes right, 0 pushes left.

    Returns:
        ``(next_state [*B, 4], steps + 1, reward [*B], terminated [*B] bool, truncated [*B] bool)``:
        gymnasium's ``step`` (with the ``TimeLimit`` wrapper); ``next_state`` is the state the
        episode ended in where it ended (reset with :func:`reset_done`).
    """
    x, x_dot, theta, theta_dot = state.unbind(-1)
    force = torch.where(action.bool(), FORCE, -FORCE)
    cos, sin = torch.cos(theta), torch.sin(theta)
    temp = (force + POLE_MASS_LENGTH * theta_dot.square() * sin) / TOTAL_MASS
    theta_acc = (GRAVITY * sin - cos * temp) / (HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * cos.square() / TOTAL_MASS))
    x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS
    next_state = torch.stack(
        [x + TAU * x_dot, x_dot + TAU * x_acc, theta + TAU * theta_dot, theta_dot + TAU * theta_acc], dim=-1
    )
    nx, ntheta = next_state[..., 0], next_state[..., 2]
    terminated = (nx < -X_LIMIT) | (nx > X_LIMIT) | (ntheta < -THETA_LIMIT) | (ntheta > THETA_LIMIT)
    steps = steps + 1
    truncated = steps >= MAX_STEPS  # TimeLimit's rule: may coincide with termination
    reward = torch.ones_like(x)
    return next_state, steps, reward, terminated, truncated


def reset_done(state: torch.Tensor, steps: torch.Tensor, done: torch.Tensor, fresh: torch.Tensor):
    """Where ``done [*B]``, replace ``state`` by ``fresh [*B, 4]`` and the step count by 0."""
    return torch.where(done.unsqueeze(-1), fresh, state), torch.where(done, 0, steps)
