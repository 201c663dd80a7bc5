#[cfg(target_arch = "x86_64")]
use super::dispatch::run_avx2;
use super::dispatch::{Job, map_with};
use super::rows::{layer_norm_with, softmax_with, sum_with};
use super::*;

#[test]
fn known_values() {
    let mut xs = [0.0f32, 1.0, -1.0, 100.0, -200.0, f32::NAN];
    apply(StripOp::Exp, &mut xs);
    assert_eq!(xs[0], 1.0);
    assert!((xs[1] - std::f32::consts::E).abs() <= f32::EPSILON * 3.0);
    assert!((xs[2] - 1.0 / std::f32::consts::E).abs() <= f32::EPSILON);
    assert_eq!(xs[3], f32::INFINITY);
    assert_eq!(xs[4], 0.0);
    assert!(xs[5].is_nan());
    let mut t = [0.5f32, -0.5, 20.0, -0.0];
    apply(StripOp::Tanh, &mut t);
    assert!((t[0] - 0.5f32.tanh()).abs() <= f32::EPSILON);
    assert_eq!(t[1], -t[0]);
    assert_eq!(t[2], 1.0);
    assert!(t[3] == 0.0 && t[3].is_sign_negative());
    let mut s = [0.0f32, 2.0];
    apply(StripOp::Sigmoid, &mut s);
    assert_eq!(s[0], 0.5);
    assert!((s[1] - 0.880_797_1).abs() <= f32::EPSILON);
}

/// Every build of the loops (AVX-512, AVX2, portable) gives the same bits.
#[test]
fn every_isa_gives_the_same_bits() {
    let xs: Vec<f32> = (0u32..1 << 16)
        .map(|i| f32::from_bits(i.wrapping_mul(65_521).rotate_left(7)))
        .chain([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            88.72284,
            -103.97208,
        ])
        .collect();
    for op in StripOp::ALL {
        let mut want = xs.clone();
        map_with(op, &mut want);
        let mut got = xs.clone();
        apply(op, &mut got);
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            let mut v = xs.clone();
            // SAFETY: AVX2 and FMA are present.
            unsafe { run_avx2(Job::Map(op, &mut v)) };
            same(op, &v, &want);
        }
        same(op, &got, &want);
    }
    let finite: Vec<f32> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    for log in [false, true] {
        let row = &finite[..1000.min(finite.len())];
        let mut want = vec![0.0; row.len()];
        softmax_with(row, &mut want, log);
        let mut got = vec![0.0; row.len()];
        softmax(row, &mut got, log);
        same(StripOp::Exp, &got, &want);
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA are present.
            unsafe { run_avx2(Job::Softmax(row, &mut got, log)) };
            same(StripOp::Exp, &got, &want);
        }
    }
    let row = &finite[..1000.min(finite.len())];
    let wb: Vec<f32> = row.iter().map(|x| x.abs().min(3.0)).collect();
    for (w, b) in [
        (Some(&wb[..]), Some(&wb[..])),
        (None, Some(&wb[..])),
        (Some(&wb[..]), None),
        (None, None),
    ] {
        let mut want = vec![0.0; row.len()];
        layer_norm_with(row, &mut want, w, b, 1e-5);
        let mut got = vec![0.0; row.len()];
        layer_norm(row, &mut got, w, b, 1e-5);
        same(StripOp::Exp, &got, &want);
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            let job = Job::LayerNorm {
                xs: row,
                out: &mut got,
                w,
                b,
                eps: 1e-5,
            };
            // SAFETY: AVX2 and FMA are present.
            unsafe { run_avx2(job) };
            same(StripOp::Exp, &got, &want);
        }
    }
    let want = sum_with(&finite);
    assert_eq!(sum(&finite).to_bits(), want.to_bits());
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        let mut s = 0.0;
        // SAFETY: AVX2 and FMA are present.
        unsafe { run_avx2(Job::Sum(&finite, &mut s)) };
        assert_eq!(s.to_bits(), want.to_bits());
    }
}

/// Mapping from a source (disjoint, the same memory, or partly overlapping the
/// destination) gives the bits of mapping a copy in place, on every build of the loops,
/// for lengths around the lane counts.
#[test]
fn maps_from_a_source_as_in_place() {
    let xs: Vec<f32> = (0u32..4099)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 8) as f32 / (1 << 20) as f32 - 8.0)
        .collect();
    for op in StripOp::ALL {
        for n in [0, 1, 7, 8, 15, 16, 17, 129, 4099] {
            let src = &xs[..n];
            let mut want = src.to_vec();
            map_with(op, &mut want);
            let mut got = vec![0.0; n];
            apply_from(op, src, &mut got);
            same(op, &got, &want);
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                let job = Job::MapFrom {
                    op,
                    src: src.as_ptr(),
                    dst: got.as_mut_ptr(),
                    n,
                };
                // SAFETY: AVX2 and FMA are present; two distinct buffers of `n` f32s.
                unsafe { run_avx2(job) };
                same(op, &got, &want);
            }
            // the same memory, and a destination one element past its source
            let mut buf = src.to_vec();
            buf.push(0.0);
            let p = buf.as_mut_ptr();
            // SAFETY: `buf` holds n + 1 f32s; the helper allows any overlap.
            unsafe { strip_math(op as i32, p, p, n as i64) };
            same(op, &buf[..n], &want);
            let mut buf = src.to_vec();
            buf.push(0.0);
            let p = buf.as_mut_ptr();
            // SAFETY: as above, both ranges inside `buf`.
            unsafe { strip_math(op as i32, p, p.add(1), n as i64) };
            same(op, &buf[1..], &want);
        }
    }
}

fn same(op: StripOp, a: &[f32], b: &[f32]) {
    for (x, y) in a.iter().zip(b) {
        assert!(
            x.to_bits() == y.to_bits() || x.is_nan() && y.is_nan(),
            "{op:?}"
        );
    }
}

#[test]
fn sums_in_f64() {
    // 2^24 + 1 + 1 + ...: an f32 accumulator would lose every 1
    let mut xs = vec![1.0f32; 1000];
    xs[0] = 16_777_216.0;
    assert_eq!(sum(&xs), 16_777_216.0 + 999.0);
    assert_eq!(sum(&xs[..7]), 16_777_216.0 + 6.0);
    assert!(sum(&[1.0, f32::NAN, 2.0]).is_nan());
    assert_eq!(sum(&[f32::INFINITY, 1.0]), f64::INFINITY);
    // SAFETY: no element is read.
    assert_eq!(unsafe { strip_sum(std::ptr::null(), -3) }, 0.0);
}

/// Maxima and minima against a sequential fold, around the 32-lane chunks, on every
/// ISA: a NaN anywhere gives NaN, infinities count, an empty run gives `∓inf`.
#[test]
fn extremes_match_a_sequential_fold() {
    let fold = |xs: &[f32], max: bool| {
        let init = if max {
            f32::NEG_INFINITY
        } else {
            f32::INFINITY
        };
        let pick = |a: f32, x: f32| if max { a.max(x) } else { a.min(x) };
        if xs.iter().any(|x| x.is_nan()) {
            f32::NAN
        } else {
            xs.iter().copied().fold(init, pick)
        }
    };
    let check = |xs: &[f32]| {
        for max in [true, false] {
            let want = fold(xs, max);
            let mut got = vec![extreme(xs, max)];
            #[cfg(target_arch = "x86_64")]
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                let mut r = 0.0;
                // SAFETY: AVX2 and FMA are present.
                unsafe { run_avx2(Job::Extreme(xs, &mut r, max)) };
                got.push(r);
            }
            for g in got {
                assert!(
                    g == want || (g.is_nan() && want.is_nan()),
                    "max={max} n={}: {g} vs {want}",
                    xs.len()
                );
            }
        }
    };
    for n in [0usize, 1, 7, 31, 32, 33, 64, 95, 257] {
        let xs: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.25)
            .collect();
        check(&xs);
        for at in [0, n / 2, n.saturating_sub(1)]
            .into_iter()
            .filter(|&a| a < n)
        {
            for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30] {
                let mut ys = xs.clone();
                ys[at] = v;
                check(&ys);
            }
        }
    }
    // SAFETY: no element is read.
    unsafe {
        assert_eq!(strip_max(std::ptr::null(), -1), f32::NEG_INFINITY);
        assert_eq!(strip_min(std::ptr::null(), 0), f32::INFINITY);
    }
}

/// Column sums add rows in order, whatever the ISA, stride or row count.
#[test]
fn column_sums_add_rows_in_order() {
    let (rows, cols, stride) = (7usize, 37usize, 41usize);
    let xs: Vec<f32> = (0..rows * stride)
        .map(|i| f32::from_bits((i as u32).wrapping_mul(2_654_435_761) >> 2))
        .map(|x| if x.is_finite() { x } else { 1.5 })
        .collect();
    let want: Vec<f64> = (0..cols)
        .map(|c| (0..rows).fold(0.0f64, |s, r| s + f64::from(xs[r * stride + c])))
        .collect();
    let mut got = vec![f64::NAN; cols];
    // SAFETY: every row lies in `xs`, `got` holds `cols` f64s.
    unsafe {
        col_sum(
            xs.as_ptr(),
            stride as i64,
            cols as i64,
            rows as i64,
            got.as_mut_ptr(),
        )
    };
    assert_eq!(bits(&got), bits(&want));
    // rows walked backwards
    let last = xs[(rows - 1) * stride..].as_ptr();
    // SAFETY: as above, from the last row down.
    unsafe {
        col_sum(
            last,
            -(stride as i64),
            cols as i64,
            rows as i64,
            got.as_mut_ptr(),
        )
    };
    let back: Vec<f64> = (0..cols)
        .map(|c| {
            (0..rows)
                .rev()
                .fold(0.0f64, |s, r| s + f64::from(xs[r * stride + c]))
        })
        .collect();
    assert_eq!(bits(&got), bits(&back));
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        let mut v = vec![f64::NAN; cols];
        let job = Job::Cols {
            src: xs.as_ptr(),
            stride: stride as isize,
            rows,
            dst: &mut v,
        };
        // SAFETY: AVX2 and FMA are present; the rows lie in `xs`.
        unsafe { run_avx2(job) };
        assert_eq!(bits(&v), bits(&want));
    }
    // no rows: zeros; bad counts: nothing written
    // SAFETY: no element is read; `got` holds `cols` f64s.
    unsafe { col_sum(std::ptr::null(), 0, cols as i64, 0, got.as_mut_ptr()) };
    assert!(got.iter().all(|&s| s == 0.0));
    // SAFETY: nothing is read or written.
    unsafe { col_sum(std::ptr::null(), 1, -1, 3, std::ptr::null_mut()) };
}

fn bits(xs: &[f64]) -> Vec<u64> {
    xs.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn bad_calls_do_nothing() {
    let mut xs = [1.0f32; 4];
    // SAFETY: four valid f32s.
    unsafe {
        strip_math(99, xs.as_ptr(), xs.as_mut_ptr(), 4);
        strip_math(0, xs.as_ptr(), xs.as_mut_ptr(), -1);
    }
    assert_eq!(xs, [1.0; 4]);
    // overlapping source and destination: the same as mapping a copy of the source
    let mut buf = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
    let mut want = [0.0f32, 1.0, 2.0, 3.0];
    apply(StripOp::Exp, &mut want);
    // SAFETY: both ranges lie in `buf`.
    unsafe { strip_math(0, buf.as_ptr(), buf.as_mut_ptr().add(2), 4) };
    assert_eq!(&buf[2..], &want);
}
#[test]
fn stream_copies_every_element() {
    let src: Vec<f32> = (0..600).map(|i| i as f32 * 1.5 - 7.0).collect();
    for off in 0..9 {
        for n in [0usize, 1, 7, 8, 9, 31, 100, 513] {
            let mut dst = vec![-1.0f32; n + 20];
            // SAFETY: `src` holds 600 elements and `dst` `off + n` or more; disjoint.
            unsafe { stream(src.as_ptr(), dst.as_mut_ptr().add(off), n as i64) };
            fence();
            assert_eq!(&dst[off..off + n], &src[..n], "offset {off}, {n} elements");
            assert!(dst[..off].iter().chain(&dst[off + n..]).all(|&v| v == -1.0));
        }
    }
    let mut dst = [3.0f32; 4];
    // SAFETY: a negative count touches nothing.
    unsafe { stream(src.as_ptr(), dst.as_mut_ptr(), -2) };
    assert_eq!(dst, [3.0; 4]);
}
