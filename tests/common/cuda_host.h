// CUDA C on the host: just enough of the CUDA language for smelt's generated kernels to
// compile with a C++20 compiler and run on CPU threads. A launch of a kernel whose threads
// meet (__syncthreads, warp shuffles) runs every thread of a block as an OS thread and the
// blocks one after another, so __syncthreads is a barrier and a warp shuffle is an exchange
// through memory between two barriers; a kernel whose threads never meet runs them one
// after another on the caller's thread.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <atomic>
#include <barrier>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

struct dim3 {
  unsigned int x, y, z;
};
static thread_local dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
static std::barrier<>* sm_host_barrier;

inline void __syncthreads() {
  if (!sm_host_barrier) {
    fprintf(stderr, "a kernel launched one thread at a time met a barrier\n");
    abort();
  }
  sm_host_barrier->arrive_and_wait();
}

// Every thread of the block takes part in each shuffle of the generated reductions.
static unsigned char sm_host_lanes[1024 * 8];
template <class T> T __shfl_xor_sync(unsigned int, T v, int o) {
  static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
  memcpy(sm_host_lanes + threadIdx.x * sizeof(T), &v, sizeof(T));
  __syncthreads();
  T r;
  memcpy(&r, sm_host_lanes + (threadIdx.x ^ (unsigned int)o) * sizeof(T), sizeof(T));
  __syncthreads();
  return r;
}

inline float __int_as_float(int i) {
  float f;
  memcpy(&f, &i, 4);
  return f;
}
inline double __longlong_as_double(long long i) {
  double d;
  memcpy(&d, &i, 8);
  return d;
}

struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) longlong2 { long long x, y; };
struct alignas(8) short4 { short x, y, z, w; };
struct alignas(8) ushort4 { unsigned short x, y, z, w; };
struct alignas(4) char4 { signed char x, y, z, w; };
struct alignas(4) uchar4 { unsigned char x, y, z, w; };

// f16 as GCC's _Float16 (its conversions round to nearest even, from double in one step);
// bf16 as its bits, rounded by hand.
struct __half {
  _Float16 v;
};
inline float __half2float(__half h) { return (float)h.v; }
inline __half __float2half_rn(float f) { return {(_Float16)f}; }
inline __half __double2half(double d) { return {(_Float16)d}; }
inline __half __ushort_as_half(unsigned short u) {
  __half h;
  memcpy(&h, &u, 2);
  return h;
}
inline unsigned short __half_as_ushort(__half h) {
  unsigned short u;
  memcpy(&u, &h, 2);
  return u;
}

struct __nv_bfloat16 {
  unsigned short bits;
};
inline float __bfloat162float(__nv_bfloat16 b) {
  unsigned int u = (unsigned int)b.bits << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned int u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {(unsigned short)((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {(unsigned short)(u >> 16)};
}
// double to float rounded to odd, then to bf16: one correct rounding overall
inline __nv_bfloat16 __double2bfloat16(double d) {
  float t = (float)d;
  if (t == t && !isinf(t) && (double)t != d) {
    if (fabs((double)t) > fabs(d)) t = nextafterf(t, 0.0f);
    unsigned int u;
    memcpy(&u, &t, 4);
    u |= 1u;
    memcpy(&t, &u, 4);
  }
  return __float2bfloat16_rn(t);
}
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return {u}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }

// Atomic adds, as CUDA's: they return the old value.
template <class T> T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
template <class H, class ToF, class FromF> H sm_host_cas_add(H* p, H v, ToF to, FromF from) {
  std::atomic_ref<H> a(*p);
  H old = a.load(), next;
  do {
    next = from(to(old) + to(v));
  } while (!a.compare_exchange_weak(old, next));
  return old;
}
inline __half atomicAdd(__half* p, __half v) {
  return sm_host_cas_add(p, v, __half2float, __float2half_rn);
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
  return sm_host_cas_add(p, v, __bfloat162float, __float2bfloat16_rn);
}

// Runs `kernel`, whose threads never meet, on a grid of `grid` blocks of `block` threads,
// one thread after another (no OS threads, no barriers: most kernels are pointwise).
template <class F> void sm_host_launch_serial(unsigned int grid, unsigned int block, F kernel) {
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  sm_host_barrier = nullptr;
  for (unsigned int b = 0; b < grid; ++b) {
    blockIdx = {b, 0, 0};
    for (unsigned int t = 0; t < block; ++t) {
      threadIdx = {t, 0, 0};
      kernel();
    }
  }
}

// Runs `kernel` on a grid of `grid` blocks of `block` threads.
template <class F> void sm_host_launch(unsigned int grid, unsigned int block, F kernel) {
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  std::barrier<> bar(block);
  sm_host_barrier = &bar;
  std::vector<std::thread> threads;
  for (unsigned int t = 0; t < block; ++t) {
    threads.emplace_back([&, t] {
      threadIdx = {t, 0, 0};
      for (unsigned int b = 0; b < grid; ++b) {
        blockIdx = {b, 0, 0};
        kernel();
        // the block's shared memory is reused by the next block
        bar.arrive_and_wait();
      }
    });
  }
  for (auto& th : threads) th.join();
}
