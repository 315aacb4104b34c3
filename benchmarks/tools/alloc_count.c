/* Counts the large CPU tensor buffers a process allocates (an LD_PRELOAD shim; glibc, Linux).
 *
 * PyTorch's CPU allocator takes every tensor's storage from posix_memalign; this shim wraps it and free,
 * and keeps, for blocks of 1 MiB or more: the bytes live now, their peak, and the count and bytes
 * allocated since the last reset. Read them from Python with ctypes (docs/ensembles.md, "Speed"):
 *
 *   gcc -O2 -shared -fPIC -o /tmp/alloc_count.so benchmarks/tools/alloc_count.c -ldl
 *   LD_PRELOAD=/tmp/alloc_count.so python ...
 *
 *   lib = ctypes.CDLL(None); lib.alloc_count_reset(); step()
 *   lib.alloc_count_blocks(), lib.alloc_count_bytes(), lib.alloc_count_peak() - <live bytes before>
 *   (restype ctypes.c_longlong for each)
 *
 * Approximate: a free of any block of 1 MiB or more counts, whoever allocated it (torch takes its tensors
 * from posix_memalign). Single-threaded bookkeeping (no locks): use it with one torch thread.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stddef.h>

#define LARGE (1 << 20)

static int (*real_posix_memalign)(void **, size_t, size_t);
static void (*real_free)(void *);
static long long live, peak, blocks, bytes;

int posix_memalign(void **out, size_t alignment, size_t size) {
  if (!real_posix_memalign) real_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
  int status = real_posix_memalign(out, alignment, size);
  if (status == 0 && size >= LARGE) {
    size_t usable = malloc_usable_size(*out);
    live += usable;
    bytes += usable;
    blocks++;
    if (live > peak) peak = live;
  }
  return status;
}

void free(void *ptr) {
  if (!real_free) real_free = dlsym(RTLD_NEXT, "free");
  if (ptr) {
    size_t usable = malloc_usable_size(ptr);
    if (usable >= LARGE) live -= usable;
  }
  real_free(ptr);
}

long long alloc_count_live(void) { return live; }
long long alloc_count_peak(void) { return peak; }
long long alloc_count_blocks(void) { return blocks; }
long long alloc_count_bytes(void) { return bytes; }
void alloc_count_reset(void) { peak = live; blocks = 0; bytes = 0; }
