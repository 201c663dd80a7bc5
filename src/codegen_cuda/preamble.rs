//! The helper functions every generated CUDA translation unit starts with.
//!
//! Integer arithmetic goes through unsigned 64-bit helpers so overflow wraps as in the eager
//! kernels (signed overflow is undefined in C++). f16/bf16 values live in `float` variables
//! holding exactly representable values: every op computes in f32 and rounds back once.

/// Includes needed when a kernel touches f16 or bf16 data.
pub const HALF_INCLUDES: &str = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n";

/// Half-precision rounding helpers (need `HALF_INCLUDES`).
pub const HALF_HELPERS: &str = r#"
__device__ __forceinline__ float sm_rh(float x) { return __half2float(__float2half_rn(x)); }
__device__ __forceinline__ float sm_rb(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
"#;

/// Helpers every unit needs: special floats, wrapping integer ops, Python's remainder, NaN
/// propagating max/min, and the block-wide combine of a row reduction.
pub const COMMON: &str = r#"
#define SM_INF_F __int_as_float(0x7f800000)
#define SM_NAN_F __int_as_float(0x7fc00000)
#define SM_INF_D __longlong_as_double(0x7ff0000000000000LL)
#define SM_NAN_D __longlong_as_double(0x7ff8000000000000LL)
typedef unsigned long long sm_u64;

template <class T> __device__ __forceinline__ T sm_wadd(T a, T b) { return (T)((sm_u64)(long long)a + (sm_u64)(long long)b); }
template <class T> __device__ __forceinline__ T sm_wsub(T a, T b) { return (T)((sm_u64)(long long)a - (sm_u64)(long long)b); }
template <class T> __device__ __forceinline__ T sm_wmul(T a, T b) { return (T)((sm_u64)(long long)a * (sm_u64)(long long)b); }
template <class T> __device__ __forceinline__ T sm_wneg(T a) { return (T)((sm_u64)0 - (sm_u64)(long long)a); }
template <class T> __device__ __forceinline__ T sm_iabs(T a) { return a < (T)0 ? sm_wneg(a) : a; }
template <class T> __device__ __forceinline__ T sm_isign(T a) { return (T)((a > (T)0) - (a < (T)0)); }

/* Integer power by squaring, wrapping; negative exponents as PyTorch (1, +-1 for -1, else 0). */
template <class T> __device__ __forceinline__ T sm_ipow(T a, T b) {
  long long x = (long long)a, e = (long long)b;
  if (e < 0) return (T)(x == 1 ? 1 : (x == -1 ? ((e & 1) ? -1 : 1) : 0));
  sm_u64 r = 1, p = (sm_u64)x;
  while (e != 0) { if (e & 1) r *= p; e >>= 1; p *= p; }
  return (T)r;
}

/* Python's %: the result has the divisor's sign. A zero divisor raises the error flag. */
template <class T> __device__ __forceinline__ T sm_irem(T a, T b, unsigned int* err) {
  if (b == (T)0) { *err = 1u; return (T)0; }
  long long x = (long long)a, y = (long long)b;
  if (y == -1) return (T)0;
  long long r = x % y;
  if (r != 0 && ((r < 0) != (y < 0))) r += y;
  return (T)r;
}
__device__ __forceinline__ float sm_frem(float a, float b) {
  float r = fmodf(a, b);
  return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
__device__ __forceinline__ double sm_frem(double a, double b) {
  double r = fmod(a, b);
  return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}

/* torch.div(rounding_mode="trunc"/"floor"): as PyTorch's div_trunc and div_floor kernels. */
template <class T> __device__ __forceinline__ T sm_idiv_trunc(T a, T b, unsigned int* err) {
  if (b == (T)0) { *err = 1u; return (T)0; }
  long long x = (long long)a, y = (long long)b;
  if (y == -1) return (T)(0ull - (unsigned long long)x);
  return (T)(x / y);
}
template <class T> __device__ __forceinline__ T sm_idiv_floor(T a, T b, unsigned int* err) {
  if (b == (T)0) { *err = 1u; return (T)0; }
  long long x = (long long)a, y = (long long)b;
  if (y == -1) return (T)(0ull - (unsigned long long)x);
  long long q = x / y;
  return (x % y != 0 && ((x < 0) != (y < 0))) ? (T)(q - 1) : (T)q;
}
__device__ __forceinline__ float sm_fdiv_trunc(float a, float b) { return truncf(a / b); }
__device__ __forceinline__ double sm_fdiv_trunc(double a, double b) { return trunc(a / b); }
template <class F> __device__ __forceinline__ F sm_fdiv_floor(F a, F b) {
  if (b == (F)0) return a / b;
  F m = fmod(a, b);
  F div = (a - m) / b;
  if (m != (F)0 && ((b < (F)0) != (m < (F)0))) div -= (F)1;
  if (div == (F)0) return copysign((F)0, a / b);
  F fl = floor(div);
  return (div - fl > (F)0.5) ? fl + (F)1 : fl;
}

/* torch.maximum / torch.minimum: NaN wins. */
__device__ __forceinline__ float sm_fmax(float a, float b) { return (a != a || b != b) ? SM_NAN_F : (a < b ? b : a); }
__device__ __forceinline__ float sm_fmin(float a, float b) { return (a != a || b != b) ? SM_NAN_F : (b < a ? b : a); }
__device__ __forceinline__ double sm_fmax(double a, double b) { return (a != a || b != b) ? SM_NAN_D : (a < b ? b : a); }
__device__ __forceinline__ double sm_fmin(double a, double b) { return (a != a || b != b) ? SM_NAN_D : (b < a ? b : a); }

/* Reduction combiners: associative, and for max/min NaN wins. */
struct SmSum { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; } };
struct SmISum { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return sm_wadd(a, b); } };
struct SmProd { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a * b; } };
struct SmIProd { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return sm_wmul(a, b); } };
struct SmMax { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return (b != b || b > a) ? b : a; } };
struct SmMin { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return (b != b || b < a) ? b : a; } };
struct SmAnd { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a & b; } };
struct SmOr { template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a | b; } };

/* Combines one value per thread over the block (blockDim.x a multiple of 32); every thread
   gets the result, combined in the same order everywhere. */
template <class T, class F> __device__ __forceinline__ T sm_block_reduce(T v, F f, void* shared) {
  T* sh = (T*)shared;
  for (int o = 16; o > 0; o >>= 1) v = f(v, (T)__shfl_xor_sync(0xffffffffu, v, o));
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  T r = sh[0];
  for (int i = 1; i < nw; ++i) r = f(r, sh[i]);
  return r;
}

/* argmax/argmin step: does (bv, bi) beat (av, ai)? NaN beats numbers, ties go to the first. */
template <class T> __device__ __forceinline__ bool sm_arg_better(T av, long long ai, T bv, long long bi, bool is_max) {
  bool an = av != av, bn = bv != bv;
  if (an || bn) return bn && (!an || bi < ai);
  if (bv == av) return bi < ai;
  return is_max ? bv > av : bv < av;
}
template <class T> __device__ __forceinline__ void sm_block_arg(T& v, long long& i, bool is_max, void* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    T ov = __shfl_xor_sync(0xffffffffu, v, o);
    long long oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (sm_arg_better(v, i, ov, oi, is_max)) { v = ov; i = oi; }
  }
  T* shv = (T*)shared;
  long long* shi = ((long long*)shared) + 32;
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
  __syncthreads();
  if (lane == 0) { shv[w] = v; shi[w] = i; }
  __syncthreads();
  v = shv[0]; i = shi[0];
  for (int k = 1; k < nw; ++k) if (sm_arg_better(v, i, shv[k], shi[k], is_max)) { v = shv[k]; i = shi[k]; }
}
"#;
