//! The float operations Cranelift calls by their libm names when the target lacks an
//! instruction for them (`fma` without FMA, rounding without SSE4.1), and the memory
//! functions it may call: a C program links them from libc and libm; code loaded by the
//! JIT's disk cache is pointed at these.

macro_rules! libcalls {
    ($($name:ident($($a:ident: $t:ty),*) -> $r:ty $body:block)*) => {
        /// The names compiled code may call.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];

        /// The address of libcall `name`.
        pub fn address(name: &str) -> Option<*const u8> {
            $(
                extern "C" fn $name($($a: $t),*) -> $r $body
            )*
            match name {
                $(stringify!($name) => Some($name as *const u8),)*
                _ => None,
            }
        }
    };
}

libcalls! {
    fmaf(a: f32, b: f32, c: f32) -> f32 { a.mul_add(b, c) }
    fma(a: f64, b: f64, c: f64) -> f64 { a.mul_add(b, c) }
    floorf(a: f32) -> f32 { a.floor() }
    floor(a: f64) -> f64 { a.floor() }
    ceilf(a: f32) -> f32 { a.ceil() }
    ceil(a: f64) -> f64 { a.ceil() }
    truncf(a: f32) -> f32 { a.trunc() }
    trunc(a: f64) -> f64 { a.trunc() }
    nearbyintf(a: f32) -> f32 { a.round_ties_even() }
    nearbyint(a: f64) -> f64 { a.round_ties_even() }
    memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
        // SAFETY: compiled code passes `n` valid, non-overlapping bytes, as C's memcpy.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
        dst
    }
    memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
        // SAFETY: compiled code passes `n` valid bytes, as C's memmove.
        unsafe { std::ptr::copy(src, dst, n) };
        dst
    }
    memset(dst: *mut u8, c: i32, n: usize) -> *mut u8 {
        // SAFETY: compiled code passes `n` writable bytes, as C's memset.
        unsafe { std::ptr::write_bytes(dst, c as u8, n) };
        dst
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_name_has_an_address_and_rounds_as_libm() {
        for n in super::NAMES {
            assert!(super::address(n).is_some(), "{n}");
        }
        assert!(super::address("sin").is_none());
        let f = super::address("nearbyintf").unwrap();
        // SAFETY: `nearbyintf` is an `extern "C" fn(f32) -> f32`.
        let f: extern "C" fn(f32) -> f32 = unsafe { std::mem::transmute(f) };
        assert_eq!((f(2.5), f(3.5), f(-0.5)), (2.0, 4.0, -0.0));
    }
}
