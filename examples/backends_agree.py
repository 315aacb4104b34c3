"""Build params, run lstm_sequence and gru_sequence with resets on every backend available for the cell,
and print that they agree with ``reference`` (outputs and final state)."""

import torch

import rnn_functional as rf


def main() -> None:
    torch.manual_seed(0)
    B, T, F, H, L = 8, 32, 16, 32, 2
    x = torch.randn(B, T, F, dtype=torch.float64)
    is_init = torch.rand(B, T) < 0.1
    for name, cell, init, run in [
        ("LSTM", "lstm", rf.init_lstm_params, rf.lstm_sequence),
        ("GRU", "gru", rf.init_gru_params, rf.gru_sequence),
    ]:
        backends = [b for b in rf.available_backends(cell=cell) if b != "reference"] + ["auto"]
        params = init(F, H, L, dtype=torch.float64)
        expected = run(x, None, params, is_init=is_init, backend="reference")
        for backend in backends:
            got = run(x, None, params, is_init=is_init, backend=backend)
            torch.testing.assert_close(got, expected)
            err = (got[0] - expected[0]).abs().max().item()
            print(f"{name} {backend:>9s} == reference  (max |dy| = {err:.1e}, {int(is_init.sum())} resets)")
    print("all backends agree")


if __name__ == "__main__":
    main()
