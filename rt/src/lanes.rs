//! A few lanes of f32 behind one interface, for the helpers whose loops the compiler cannot
//! vectorise by itself: a lookup of one of eight constants per lane (`vpermps`) has no
//! scalar form LLVM turns into a permute. The same generic code runs on 16 lanes (AVX-512),
//! 8 lanes (AVX2 + FMA) and one lane (`f32`, the portable loop and every tail), with the same
//! operations in the same order, so all three give the same bits.
//!
//! Every method is `#[inline(always)]`: the vector types may only be used inside a function
//! compiled for their features (`#[target_feature]`), where the intrinsics inline.

/// The operations the generic helpers use. Comparisons give a mask `M`; integer lanes `I`
/// hold the bits of the float lanes.
pub(crate) trait Lanes: Copy {
    /// Lanes per value.
    const N: usize;
    type I: Copy;
    type M: Copy;
    /// # Safety
    /// `p` points to `N` readable f32s.
    unsafe fn load(p: *const f32) -> Self;
    /// # Safety
    /// `p` points to `N` writable f32s.
    unsafe fn store(self, p: *mut f32);
    fn splat(c: f32) -> Self;
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    /// `self·m + a`, rounded once.
    fn fma(self, m: Self, a: Self) -> Self;
    fn abs(self) -> Self;
    fn neg(self) -> Self;
    /// `self > o ? hi : self` then `self < lo ? lo : self`, as compare + select: NaN passes.
    fn clamp(self, lo: f32, hi: f32) -> Self;
    fn gt(self, o: Self) -> Self::M;
    fn lt(self, o: Self) -> Self::M;
    fn eq(self, o: Self) -> Self::M;
    /// `m ? a : b` lane by lane.
    fn select(m: Self::M, a: Self, b: Self) -> Self;
    fn bits(self) -> Self::I;
    fn from_bits(i: Self::I) -> Self;
    fn isplat(c: i32) -> Self::I;
    fn iadd(a: Self::I, b: Self::I) -> Self::I;
    fn isub(a: Self::I, b: Self::I) -> Self::I;
    fn imin(a: Self::I, b: Self::I) -> Self::I;
    /// Arithmetic shift right by one.
    fn sshr1(a: Self::I) -> Self::I;
    /// Logical shift right by 21 (the exponent and two leading mantissa bits of an f32).
    fn ushr21(a: Self::I) -> Self::I;
    /// Shift left by 23 (an exponent into place).
    fn shl23(a: Self::I) -> Self::I;
    /// `t[i]` per lane, for lanes `i ∈ [0, 8)`.
    fn lookup8(i: Self::I, t: &[f32; 8]) -> Self;
}

impl Lanes for f32 {
    const N: usize = 1;
    type I = i32;
    type M = bool;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: `p` points to `N` = 1 readable f32 by the caller's contract (`Lanes::load`).
        unsafe { *p }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        // SAFETY: `p` points to `N` = 1 writable f32 by the caller's contract (`Lanes::store`).
        unsafe { *p = self }
    }
    #[inline(always)]
    fn splat(c: f32) -> Self {
        c
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self + o
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self - o
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self * o
    }
    #[inline(always)]
    fn fma(self, m: Self, a: Self) -> Self {
        self.mul_add(m, a)
    }
    #[inline(always)]
    fn abs(self) -> Self {
        f32::abs(self)
    }
    #[inline(always)]
    fn neg(self) -> Self {
        -self
    }
    #[inline(always)]
    fn clamp(self, lo: f32, hi: f32) -> Self {
        let x = if self > hi { hi } else { self };
        if x < lo { lo } else { x }
    }
    #[inline(always)]
    fn gt(self, o: Self) -> bool {
        self > o
    }
    #[inline(always)]
    fn lt(self, o: Self) -> bool {
        self < o
    }
    #[inline(always)]
    fn eq(self, o: Self) -> bool {
        self == o
    }
    #[inline(always)]
    fn select(m: bool, a: Self, b: Self) -> Self {
        if m { a } else { b }
    }
    #[inline(always)]
    fn bits(self) -> i32 {
        self.to_bits() as i32
    }
    #[inline(always)]
    fn from_bits(i: i32) -> Self {
        f32::from_bits(i as u32)
    }
    #[inline(always)]
    fn isplat(c: i32) -> i32 {
        c
    }
    #[inline(always)]
    fn iadd(a: i32, b: i32) -> i32 {
        a.wrapping_add(b)
    }
    #[inline(always)]
    fn isub(a: i32, b: i32) -> i32 {
        a.wrapping_sub(b)
    }
    #[inline(always)]
    fn imin(a: i32, b: i32) -> i32 {
        a.min(b)
    }
    #[inline(always)]
    fn sshr1(a: i32) -> i32 {
        a >> 1
    }
    #[inline(always)]
    fn ushr21(a: i32) -> i32 {
        ((a as u32) >> 21) as i32
    }
    #[inline(always)]
    fn shl23(a: i32) -> i32 {
        a << 23
    }
    #[inline(always)]
    fn lookup8(i: i32, t: &[f32; 8]) -> Self {
        // the vector forms read the low 3 (AVX2) or 4 (AVX-512) bits; callers pass 0..8
        t[(i & 7) as usize]
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{X8, X16};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Lanes;
    use std::arch::x86_64::*;

    /// Eight lanes in an AVX2 register.
    #[derive(Clone, Copy)]
    pub(crate) struct X8(__m256);

    /// Sixteen lanes in an AVX-512 register.
    #[derive(Clone, Copy)]
    pub(crate) struct X16(__m512);

    // The invariant the `unsafe` blocks below rest on: the intrinsics need AVX2 + FMA (X8)
    // or AVX-512 F (X16), and values of these types are only made and used inside functions
    // compiled with those features (`tiles::product_avx2` and `product_avx512`,
    // `panels::tile_avx2`, `vmath::run_avx2` and `run_avx512`), which are only called once
    // `vmath::level` (or a test's `is_x86_feature_detected!`) has seen the features on this
    // CPU. Every method is `#[inline(always)]`, so it is compiled into that caller, with its
    // features.

    impl Lanes for X8 {
        const N: usize = 8;
        type I = __m256i;
        type M = __m256;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: AVX (X8's invariant above); `p` points to 8 readable f32s by the caller's
            // contract (`Lanes::load`), and `loadu` needs no alignment.
            X8(unsafe { _mm256_loadu_ps(p) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: AVX (X8's invariant above); `p` points to 8 writable f32s by the caller's
            // contract (`Lanes::store`), and `storeu` needs no alignment.
            unsafe { _mm256_storeu_ps(p, self.0) }
        }
        #[inline(always)]
        fn splat(c: f32) -> Self {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            X8(unsafe { _mm256_set1_ps(c) })
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            X8(unsafe { _mm256_add_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            X8(unsafe { _mm256_sub_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            X8(unsafe { _mm256_mul_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn fma(self, m: Self, a: Self) -> Self {
            // SAFETY: FMA (X8's invariant above); registers only, no memory is touched.
            X8(unsafe { _mm256_fmadd_ps(self.0, m.0, a.0) })
        }
        #[inline(always)]
        fn abs(self) -> Self {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            X8(unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), self.0) })
        }
        #[inline(always)]
        fn neg(self) -> Self {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            X8(unsafe { _mm256_xor_ps(_mm256_set1_ps(-0.0), self.0) })
        }
        #[inline(always)]
        fn clamp(self, lo: f32, hi: f32) -> Self {
            // min(a, b) = a < b ? a : b, so min(hi, x) keeps a NaN x
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            unsafe {
                let x = _mm256_min_ps(_mm256_set1_ps(hi), self.0);
                X8(_mm256_max_ps(_mm256_set1_ps(lo), x))
            }
        }
        #[inline(always)]
        fn gt(self, o: Self) -> __m256 {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            unsafe { _mm256_cmp_ps::<_CMP_GT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn lt(self, o: Self) -> __m256 {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            unsafe { _mm256_cmp_ps::<_CMP_LT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn eq(self, o: Self) -> __m256 {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            unsafe { _mm256_cmp_ps::<_CMP_EQ_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn select(m: __m256, a: Self, b: Self) -> Self {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            X8(unsafe { _mm256_blendv_ps(b.0, a.0, m) })
        }
        #[inline(always)]
        fn bits(self) -> __m256i {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            unsafe { _mm256_castps_si256(self.0) }
        }
        #[inline(always)]
        fn from_bits(i: __m256i) -> Self {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            X8(unsafe { _mm256_castsi256_ps(i) })
        }
        #[inline(always)]
        fn isplat(c: i32) -> __m256i {
            // SAFETY: AVX (X8's invariant above); registers only, no memory is touched.
            unsafe { _mm256_set1_epi32(c) }
        }
        #[inline(always)]
        fn iadd(a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: AVX2 (X8's invariant above); registers only, no memory is touched.
            unsafe { _mm256_add_epi32(a, b) }
        }
        #[inline(always)]
        fn isub(a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: AVX2 (X8's invariant above); registers only, no memory is touched.
            unsafe { _mm256_sub_epi32(a, b) }
        }
        #[inline(always)]
        fn imin(a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: AVX2 (X8's invariant above); registers only, no memory is touched.
            unsafe { _mm256_min_epi32(a, b) }
        }
        #[inline(always)]
        fn sshr1(a: __m256i) -> __m256i {
            // SAFETY: AVX2 (X8's invariant above); registers only, no memory is touched.
            unsafe { _mm256_srai_epi32::<1>(a) }
        }
        #[inline(always)]
        fn ushr21(a: __m256i) -> __m256i {
            // SAFETY: AVX2 (X8's invariant above); registers only, no memory is touched.
            unsafe { _mm256_srli_epi32::<21>(a) }
        }
        #[inline(always)]
        fn shl23(a: __m256i) -> __m256i {
            // SAFETY: AVX2 (X8's invariant above); registers only, no memory is touched.
            unsafe { _mm256_slli_epi32::<23>(a) }
        }
        #[inline(always)]
        fn lookup8(i: __m256i, t: &[f32; 8]) -> Self {
            // SAFETY: AVX2 (X8's invariant above); the load reads exactly the 8 f32s of `t`,
            // unaligned, and the permute reads only registers.
            X8(unsafe { _mm256_permutevar8x32_ps(_mm256_loadu_ps(t.as_ptr()), i) })
        }
    }

    impl Lanes for X16 {
        const N: usize = 16;
        type I = __m512i;
        type M = __mmask16;
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            // SAFETY: AVX-512 F (X16's invariant above); `p` points to 16 readable f32s by the
            // caller's contract (`Lanes::load`), and `loadu` needs no alignment.
            X16(unsafe { _mm512_loadu_ps(p) })
        }
        #[inline(always)]
        unsafe fn store(self, p: *mut f32) {
            // SAFETY: AVX-512 F (X16's invariant above); `p` points to 16 writable f32s by the
            // caller's contract (`Lanes::store`), and `storeu` needs no alignment.
            unsafe { _mm512_storeu_ps(p, self.0) }
        }
        #[inline(always)]
        fn splat(c: f32) -> Self {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            X16(unsafe { _mm512_set1_ps(c) })
        }
        #[inline(always)]
        fn add(self, o: Self) -> Self {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            X16(unsafe { _mm512_add_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn sub(self, o: Self) -> Self {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            X16(unsafe { _mm512_sub_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn mul(self, o: Self) -> Self {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            X16(unsafe { _mm512_mul_ps(self.0, o.0) })
        }
        #[inline(always)]
        fn fma(self, m: Self, a: Self) -> Self {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            X16(unsafe { _mm512_fmadd_ps(self.0, m.0, a.0) })
        }
        #[inline(always)]
        fn abs(self) -> Self {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            X16(unsafe { _mm512_abs_ps(self.0) })
        }
        #[inline(always)]
        fn neg(self) -> Self {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            X16(unsafe { _mm512_xor_ps(_mm512_set1_ps(-0.0), self.0) })
        }
        #[inline(always)]
        fn clamp(self, lo: f32, hi: f32) -> Self {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe {
                let x = _mm512_min_ps(_mm512_set1_ps(hi), self.0);
                X16(_mm512_max_ps(_mm512_set1_ps(lo), x))
            }
        }
        #[inline(always)]
        fn gt(self, o: Self) -> __mmask16 {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe { _mm512_cmp_ps_mask::<_CMP_GT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn lt(self, o: Self) -> __mmask16 {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe { _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn eq(self, o: Self) -> __mmask16 {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe { _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(self.0, o.0) }
        }
        #[inline(always)]
        fn select(m: __mmask16, a: Self, b: Self) -> Self {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            X16(unsafe { _mm512_mask_blend_ps(m, b.0, a.0) })
        }
        #[inline(always)]
        fn bits(self) -> __m512i {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe { _mm512_castps_si512(self.0) }
        }
        #[inline(always)]
        fn from_bits(i: __m512i) -> Self {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            X16(unsafe { _mm512_castsi512_ps(i) })
        }
        #[inline(always)]
        fn isplat(c: i32) -> __m512i {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe { _mm512_set1_epi32(c) }
        }
        #[inline(always)]
        fn iadd(a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe { _mm512_add_epi32(a, b) }
        }
        #[inline(always)]
        fn isub(a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe { _mm512_sub_epi32(a, b) }
        }
        #[inline(always)]
        fn imin(a: __m512i, b: __m512i) -> __m512i {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe { _mm512_min_epi32(a, b) }
        }
        #[inline(always)]
        fn sshr1(a: __m512i) -> __m512i {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe { _mm512_srai_epi32::<1>(a) }
        }
        #[inline(always)]
        fn ushr21(a: __m512i) -> __m512i {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe { _mm512_srli_epi32::<21>(a) }
        }
        #[inline(always)]
        fn shl23(a: __m512i) -> __m512i {
            // SAFETY: AVX-512 F (X16's invariant above); registers only, no memory is touched.
            unsafe { _mm512_slli_epi32::<23>(a) }
        }
        #[inline(always)]
        fn lookup8(i: __m512i, t: &[f32; 8]) -> Self {
            // the table in the low half; lanes ask for 0..8 only
            // SAFETY: AVX-512 F (X16's invariant above; AVX comes with it); the load reads
            // exactly the 8 f32s of `t`, unaligned, and the rest reads only registers.
            X16(unsafe {
                _mm512_permutexvar_ps(i, _mm512_castps256_ps512(_mm256_loadu_ps(t.as_ptr())))
            })
        }
    }
}
