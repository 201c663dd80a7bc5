//! Accuracy of the CPU backend's vectorised f32 math (src/codegen_cpu/math/).
//!
//! Each op is JIT-compiled into `fn(inputs..., out, n)`: an F32X4 loop plus a scalar tail.
//! Every input runs through the vector loop (whole array) and through the scalar tail (calls
//! with n = 3). Results are compared with f64 references rounded to f32; the max error in ulps
//! is printed (`cargo test --test cpu_math -- --nocapture`) and checked against the targets.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::types::{F32, F32X4, I64};
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value};
use cranelift_frontend::FunctionBuilder;
use cranelift_module::Linkage;
use smelt::codegen_cpu::jit::{CodeModule, Jit};
use smelt::codegen_cpu::math;
use smelt::codegen_cpu::vmath::{self, StripOp};

type Emit = dyn Fn(&mut FunctionBuilder, &[Value]) -> Value;

/// Defines `name(in_0, .., in_{arity-1}, out, n)` mapping `emit` over f32 arrays.
fn define_map(jit: &mut Jit, name: &str, arity: usize, emit: &Emit) -> cranelift_module::FuncId {
    let ptr = jit.pointer_type();
    let mut params = vec![ptr; arity + 1];
    params.push(I64);
    let sig = jit.signature(&params, &[]);
    jit.define(name, Linkage::Export, &sig, &mut |fb| {
        let b = &mut *fb.b;
        let entry = b.current_block().unwrap();
        let args = b.block_params(entry).to_vec();
        let (ins, rest) = args.split_at(arity);
        let (out, n) = (rest[0], rest[1]);
        let flags = MemFlagsData::new().with_notrap();
        // One loop per lane width: F32X4 while 4 elements remain, then F32.
        let mut i = b.ins().iconst(I64, 0);
        for (t, width) in [(F32X4, 4i64), (F32, 1)] {
            let head = b.create_block();
            let body = b.create_block();
            let next = b.create_block();
            let iv = b.append_block_param(head, I64);
            b.ins().jump(head, &[i.into()]);
            b.switch_to_block(head);
            let end = b.ins().iadd_imm_s(iv, width);
            let ok = b.ins().icmp(IntCC::SignedLessThanOrEqual, end, n);
            b.ins().brif(ok, body, &[], next, &[]);
            b.switch_to_block(body);
            let off = b.ins().imul_imm_s(iv, 4);
            let xs: Vec<Value> = ins
                .iter()
                .map(|&p| {
                    let a = b.ins().iadd(p, off);
                    b.ins().load(t, flags, a, 0)
                })
                .collect();
            let y = emit(b, &xs);
            let a = b.ins().iadd(out, off);
            b.ins().store(flags, y, a, 0);
            b.ins().jump(head, &[end.into()]);
            b.switch_to_block(next);
            i = iv;
        }
        b.ins().return_(&[]);
        Ok(())
    })
    .unwrap()
}

/// A compiled map kernel with its owning JIT.
struct Kernel {
    _jit: Jit,
    ptr: *const u8,
    arity: usize,
}

impl Kernel {
    fn new(name: &str, arity: usize, emit: &Emit) -> Kernel {
        let mut jit = Jit::new().unwrap();
        let id = define_map(&mut jit, name, arity, emit);
        jit.finalize().unwrap();
        let ptr = jit.code_ptr(id).unwrap();
        Kernel {
            _jit: jit,
            ptr,
            arity,
        }
    }

    /// Runs over `ins[..][start..start+n]` into `out[start..start+n]`.
    fn call(&self, ins: &[&[f32]], out: &mut [f32], start: usize, n: usize) {
        assert_eq!(ins.len(), self.arity);
        assert!(ins.iter().all(|x| x.len() == out.len()) && start + n <= out.len());
        let o = out[start..].as_mut_ptr();
        // SAFETY: the kernel was defined with exactly this signature; all arrays hold at least
        // `start + n` elements and the JIT lives as long as `self`.
        unsafe {
            match self.arity {
                1 => {
                    let f: extern "C" fn(*const f32, *mut f32, i64) = std::mem::transmute(self.ptr);
                    f(ins[0][start..].as_ptr(), o, n as i64)
                }
                2 => {
                    let f: extern "C" fn(*const f32, *const f32, *mut f32, i64) =
                        std::mem::transmute(self.ptr);
                    f(
                        ins[0][start..].as_ptr(),
                        ins[1][start..].as_ptr(),
                        o,
                        n as i64,
                    )
                }
                _ => unreachable!(),
            }
        }
    }

    /// Results through the vector loop (whole array) and through the scalar tail (n = 3).
    fn run_both(&self, ins: &[&[f32]]) -> (Vec<f32>, Vec<f32>) {
        let len = ins[0].len();
        let mut v = vec![0f32; len];
        self.call(ins, &mut v, 0, len);
        let mut s = vec![0f32; len];
        let mut i = 0;
        while i < len {
            let n = 3.min(len - i);
            self.call(ins, &mut s, i, n);
            i += n;
        }
        (v, s)
    }
}

fn unary(emit: fn(&mut FunctionBuilder, Value) -> Value) -> Box<Emit> {
    Box::new(move |b, xs| emit(b, xs[0]))
}

/// Error of `got` against the exact value `want` in ulps of the correctly rounded result
/// (infinities count as 2^128, so overflow by one rounding step is 1 ulp).
fn ulp_err(got: f32, want: f64) -> f64 {
    if want.is_nan() || got.is_nan() {
        return if want.is_nan() && got.is_nan() {
            0.0
        } else {
            f64::INFINITY
        };
    }
    let big = 2f64.powi(128);
    let g = if got.is_infinite() {
        big.copysign(got as f64)
    } else {
        got as f64
    };
    let w = want.clamp(-big, big);
    let r = (w as f32).abs().min(f32::MAX);
    let exp = if r < f32::MIN_POSITIVE {
        -149
    } else {
        r.log2().floor() as i32 - 23
    };
    // log2 of values just below a power of two may round up; the lower ulp is the safe bound.
    let ulp = 2f64.powi(exp.max(-149));
    if g == w { 0.0 } else { (g - w).abs() / ulp }
}

/// The special inputs every unary op is checked on, besides the sweep.
fn specials() -> Vec<f32> {
    let mut v = vec![
        0.0,
        f32::MIN_POSITIVE,
        f32::MIN_POSITIVE * 0.5,
        f32::from_bits(1),
        f32::from_bits(0x007f_ffff),
        f32::MAX,
        f32::INFINITY,
        f32::NAN,
        1.0,
        0.5,
        2.0,
        1e-8,
        1e-20,
        88.72283,
        88.72284,
        89.0,
        -87.33654,
        -103.27893,
        -103.97208,
        -104.0,
        -150.0,
        std::f32::consts::LN_2,
        std::f32::consts::PI,
        1.5707964,
        1e4,
        1e6,
        1e9,
        1073741824.0,
        1.0e20,
        1.6e38,
        3.9,
        10.5,
        -0.70710677,
        std::f32::consts::SQRT_2,
    ];
    let neg: Vec<f32> = v.iter().map(|x| -x).collect();
    v.extend(neg);
    v
}

/// Every 1024th bit pattern (with varying low bits) plus the special values.
fn sweep() -> Vec<f32> {
    let mut v: Vec<f32> = (0u32..1 << 22)
        .map(|i| f32::from_bits((i << 10) | (i.wrapping_mul(2_654_435_761) >> 22)))
        .collect();
    v.extend(specials());
    v
}

struct Stats {
    max: f64,
    at: f32,
}

fn measure(
    xs: &[f32],
    got: &[f32],
    reference: &dyn Fn(f64) -> f64,
    in_range: &dyn Fn(f32) -> bool,
) -> Stats {
    let mut st = Stats { max: 0.0, at: 0.0 };
    for (&x, &g) in xs.iter().zip(got) {
        if !in_range(x) {
            continue;
        }
        let e = ulp_err(g, reference(x as f64));
        if e > st.max || e.is_nan() {
            st = Stats { max: e, at: x };
        }
    }
    st
}

/// Sweeps one unary op through both paths and checks `max ulp ≤ target`.
fn check_unary(
    name: &str,
    emit: fn(&mut FunctionBuilder, Value) -> Value,
    reference: &dyn Fn(f64) -> f64,
    target: f64,
) {
    check_unary_with(name, emit, reference, target, false);
}

/// As [`check_unary`]; with `flushed`, where the exact result rounds below the smallest normal
/// f32 the op must return ±0 instead (the ulp check skips results within a few ulps of that
/// boundary, where a result off by one ulp may fall on either side).
fn check_unary_with(
    name: &str,
    emit: fn(&mut FunctionBuilder, Value) -> Value,
    reference: &dyn Fn(f64) -> f64,
    target: f64,
    flushed: bool,
) {
    check_unary_on(name, emit, reference, target, flushed, &sweep());
}

/// As [`check_unary_with`], on the inputs `xs`.
fn check_unary_on(
    name: &str,
    emit: fn(&mut FunctionBuilder, Value) -> Value,
    reference: &dyn Fn(f64) -> f64,
    target: f64,
    flushed: bool,
    xs: &[f32],
) {
    let k = Kernel::new(name, 1, &*unary(emit));
    let (v, s) = k.run_both(&[xs]);
    let exact = |x: f32| (reference(f64::from(x)) as f32).abs();
    let checked = |x: f32| {
        let e = exact(x);
        !flushed || e.is_nan() || e >= f32::MIN_POSITIVE * 1.000_001
    };
    if flushed {
        let mut seen = 0;
        for (i, &x) in xs.iter().enumerate() {
            if exact(x) < f32::MIN_POSITIVE && reference(f64::from(x)) != 0.0 {
                seen += 1;
                assert!(
                    v[i] == 0.0 && s[i] == 0.0,
                    "{name}({x:e}) = {:e}, {:e}: a subnormal result must be ±0",
                    v[i],
                    s[i]
                );
            }
        }
        assert!(seen > 0, "{name}: the sweep reaches no subnormal result");
    }
    let sv = measure(xs, &v, reference, &checked);
    let ss = measure(xs, &s, reference, &checked);
    println!(
        "{name:>10}: max ulp vector {:.3} (x = {:e}), scalar {:.3} (x = {:e})",
        sv.max, sv.at, ss.max, ss.at
    );
    assert!(
        sv.max <= target,
        "{name} vector: {} ulp at {:e}",
        sv.max,
        sv.at
    );
    assert!(
        ss.max <= target,
        "{name} scalar: {} ulp at {:e}",
        ss.max,
        ss.at
    );
    // Vector and scalar code are the same IR at another width: identical bits.
    for ((&x, &a), &c) in xs.iter().zip(&v).zip(&s) {
        assert!(
            a.to_bits() == c.to_bits() || (a.is_nan() && c.is_nan()),
            "{name}({x:e}): vector {a:e} != scalar {c:e}"
        );
    }
}

/// Runs a unary op on a few inputs (vector path and scalar path) and returns the results.
fn eval1(name: &str, emit: fn(&mut FunctionBuilder, Value) -> Value, xs: &[f32]) -> Vec<f32> {
    let k = Kernel::new(name, 1, &*unary(emit));
    let (v, s) = k.run_both(&[xs]);
    for (a, c) in v.iter().zip(&s) {
        assert!(a.to_bits() == c.to_bits() || (a.is_nan() && c.is_nan()));
    }
    v
}

fn assert_same(op: &str, xs: &[f32], got: &[f32], want: &[f32]) {
    for ((x, g), w) in xs.iter().zip(got).zip(want) {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{op}({x:e}) = {g:e}, expected {w:e}"
        );
    }
}

fn sigmoid_ref(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn gelu_ref(x: f64) -> f64 {
    if x == f64::NEG_INFINITY {
        return f64::NAN; // PyTorch: -inf * 0.5 * (1 + erf(-inf)) = -inf * 0
    }
    0.5 * x * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

fn gelu_tanh_ref(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    x / (1.0 + (-2.0 * u).exp())
}

#[test]
fn exp_sweep() {
    check_unary("exp", math::exp, &f64::exp, 4.0);
}

#[test]
fn expm1_sweep() {
    check_unary("expm1", math::expm1, &f64::exp_m1, 4.0);
}

#[test]
fn log_sweep() {
    check_unary("log", math::log, &f64::ln, 4.0);
}

#[test]
fn log1p_sweep() {
    check_unary("log1p", math::log1p, &f64::ln_1p, 4.0);
}

#[test]
fn tanh_sweep() {
    check_unary("tanh", math::tanh, &f64::tanh, 4.0);
}

#[test]
fn sigmoid_sweep() {
    check_unary("sigmoid", math::sigmoid, &sigmoid_ref, 4.0);
}

#[test]
fn erf_sweep() {
    check_unary("erf", math::erf, &libm::erf, 4.0);
}

#[test]
fn gelu_sweep() {
    check_unary_with("gelu", math::gelu, &gelu_ref, 4.0, true);
}

/// 2^21 + 1 points evenly over `[lo, hi]`.
fn dense(lo: f64, hi: f64) -> Vec<f32> {
    let n = 1 << 21;
    (0..=n)
        .map(|i| (lo + (hi - lo) * f64::from(i) / f64::from(n)) as f32)
        .collect()
}

/// Every interval of the GELUs' eight polynomials, densely, from results flushed to ±0 to
/// results that round to `x`.
#[test]
fn gelu_dense() {
    check_unary_on("gelu", math::gelu, &gelu_ref, 4.0, true, &dense(-14.0, 6.0));
    let xs = dense(-11.0, 6.0);
    check_unary_on("gelu_tanh", math::gelu_tanh, &gelu_tanh_ref, 4.0, true, &xs);
}

/// The exact GELU's slope `Φ(x) + x·φ(x)` and the size of its two terms.
fn gelu_slope_ref(x: f64) -> (f64, f64) {
    let cdf = 0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2);
    let xpdf = x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    (cdf + xpdf, cdf.abs() + xpdf.abs())
}

/// The tanh GELU's slope `σ + x·σ·(1-σ)·v'` (`σ = sigmoid(v)`, `v = 2u(x)`) and the size of
/// its two terms.
fn gelu_tanh_slope_ref(x: f64) -> (f64, f64) {
    let k = 2.0 * (2.0 / std::f64::consts::PI).sqrt();
    let v = k * (x + 0.044715 * x * x * x);
    let s = 1.0 / (1.0 + (-v).exp());
    let r = 1.0 / (1.0 + v.exp());
    let rest = x * s * r * k * (1.0 + 3.0 * 0.044715 * x * x);
    (s + rest, s.abs() + rest.abs())
}

/// A GELU slope against its reference on `xs`, in ulps of the larger of its two terms' sum
/// (the slope crosses 0 near x = -0.75, where the terms cancel: there no f32 formula, nor
/// PyTorch's, is accurate relative to the result); results below the smallest normal f32 must
/// be ±0, the infinities give NaN. Returns the largest error.
fn check_slope(
    name: &str,
    emit: fn(&mut FunctionBuilder, Value) -> Value,
    reference: fn(f64) -> (f64, f64),
    xs: &[f32],
) -> f64 {
    let k = Kernel::new(name, 1, &*unary(emit));
    let (v, s) = k.run_both(&[xs]);
    let mut worst = (0.0f64, 0.0f32);
    for (i, &x) in xs.iter().enumerate() {
        for got in [v[i], s[i]] {
            if x.is_nan() || x.is_infinite() {
                assert!(got.is_nan(), "{name}({x}) = {got}");
                continue;
            }
            let (want, scale) = reference(f64::from(x));
            if want.abs() < f64::from(f32::MIN_POSITIVE) {
                assert!(
                    got.abs() < f32::MIN_POSITIVE * 1.000_01,
                    "{name}({x:e}) = {got:e}, exact {want:e}"
                );
                assert!(got == 0.0 || want.abs() >= f64::from(f32::MIN_POSITIVE) * 0.999);
                continue;
            }
            let ulp =
                2f64.powi((scale.max(f64::from(f32::MIN_POSITIVE)).log2().floor() as i32) - 23);
            let err = (f64::from(got) - want).abs() / ulp;
            if err > worst.0 {
                worst = (err, x);
            }
        }
    }
    println!(
        "{name:>16}: max error {:.3} ulp of the terms (x = {:e})",
        worst.0, worst.1
    );
    worst.0
}

/// Both GELU slopes over the sweep and densely over every interval of their polynomials.
#[test]
fn gelu_slopes() {
    let mut xs = sweep();
    xs.extend(dense(-14.0, 6.0));
    let erf = check_slope("gelu_slope", math::gelu_slope, gelu_slope_ref, &xs);
    assert!(erf <= 4.0, "gelu_slope: {erf} ulp");
    let tanh = check_slope(
        "gelu_tanh_slope",
        math::gelu_tanh_slope,
        gelu_tanh_slope_ref,
        &xs,
    );
    assert!(tanh <= 5.0, "gelu_tanh_slope: {tanh} ulp");
    // known values: Φ(0) = 1/2, slope 1 far above 0, -0 far below
    for emit in [
        math::gelu_slope as math::UnaryEmitter,
        math::gelu_tanh_slope,
    ] {
        let got = eval1("known", emit, &[0.0, -0.0, 20.0, -20.0, 1e30, -1e30]);
        assert_eq!(got[..2], [0.5, 0.5]);
        assert_eq!(got[2..4], [1.0, 0.0]);
        assert_eq!(got[4..6], [1.0, 0.0]);
    }
}

#[test]
fn gelu_tanh_sweep() {
    check_unary_with("gelu_tanh", math::gelu_tanh, &gelu_tanh_ref, 4.0, true);
}

fn silu(b: &mut FunctionBuilder, x: Value) -> Value {
    let s = math::sigmoid(b, x);
    b.ins().fmul(x, s)
}

/// The strip helpers (native loops, `codegen_cpu::vmath`) return the inline code's bits on the
/// whole sweep, so the accuracy figures above hold for them too.
#[test]
fn strip_helpers_match_the_inline_math() {
    let emitters: [(StripOp, math::UnaryEmitter); 9] = [
        (StripOp::Exp, math::exp),
        (StripOp::Tanh, math::tanh),
        (StripOp::Sigmoid, math::sigmoid),
        (StripOp::Silu, silu),
        (StripOp::GeluTanh, math::gelu_tanh),
        (StripOp::GeluErf, math::gelu),
        (StripOp::Erf, math::erf),
        (StripOp::GeluErfSlope, math::gelu_slope),
        (StripOp::GeluTanhSlope, math::gelu_tanh_slope),
    ];
    let xs = sweep();
    println!("strip helpers: {}", vmath::isa());
    for (op, emit) in emitters {
        let want = eval1(&format!("{op:?}"), emit, &xs);
        let mut got = xs.clone();
        vmath::apply(op, &mut got);
        assert_same(&format!("strip {op:?}"), &xs, &got, &want);
    }
}

#[test]
fn sin_sweep() {
    check_unary("sin", math::sin, &f64::sin, 4.0);
}

#[test]
fn cos_sweep() {
    check_unary("cos", math::cos, &f64::cos, 4.0);
}

#[test]
fn sqrt_sweep() {
    check_unary("sqrt", math::sqrt, &f64::sqrt, 0.5);
}

#[test]
fn rsqrt_sweep() {
    check_unary("rsqrt", math::rsqrt, &|x: f64| 1.0 / x.sqrt(), 1.5);
}

#[test]
fn pow_sweep() {
    let k = Kernel::new("pow", 2, &|b: &mut FunctionBuilder, v: &[Value]| {
        math::pow(b, v[0], v[1])
    });
    // Bases over the whole range against a set of exponents, then random pairs in the range
    // where the result is finite and nonzero.
    let ys: [f32; 22] = [
        0.0,
        1.0,
        -1.0,
        2.0,
        -2.0,
        3.0,
        -3.0,
        0.5,
        -0.5,
        1.0 / 3.0,
        2.5,
        -2.5,
        7.0,
        10.0,
        -10.0,
        100.0,
        1e-3,
        1e-30,
        1e30,
        16777217.0,
        f32::INFINITY,
        f32::NAN,
    ];
    let bases: Vec<f32> = sweep().into_iter().step_by(16).collect();
    let mut xs = Vec::new();
    let mut es = Vec::new();
    for &y in &ys {
        for &x in &bases {
            xs.push(x);
            es.push(y);
        }
    }
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    for _ in 0..200_000 {
        let x = (2f64.powf(next() * 40.0 - 20.0)) as f32;
        let y = ((next() * 2.0 - 1.0) * 120.0 / (x as f64).log2().abs().max(1.0)) as f32;
        let neg = next() < 0.3;
        let y = if neg { y.round() } else { y };
        xs.push(if neg { -x } else { x });
        es.push(y);
    }
    let (v, s) = k.run_both(&[&xs, &es]);
    for (name, got) in [("vector", &v), ("scalar", &s)] {
        let mut worst = (0.0f64, 0.0f32, 0.0f32);
        for ((&x, &y), &g) in xs.iter().zip(&es).zip(got.iter()) {
            let e = ulp_err(g, (x as f64).powf(y as f64));
            if e > worst.0 || e.is_nan() {
                worst = (e, x, y);
            }
        }
        println!(
            "       pow: max ulp {name} {:.3} (x = {:e}, y = {:e})",
            worst.0, worst.1, worst.2
        );
        assert!(worst.0 <= 1.0, "pow {name}: {worst:?}");
    }
}

#[test]
fn pow_special_values() {
    let k = Kernel::new("pow", 2, &|b: &mut FunctionBuilder, v: &[Value]| {
        math::pow(b, v[0], v[1])
    });
    let inf = f32::INFINITY;
    let nan = f32::NAN;
    #[rustfmt::skip]
    let cases: [(f32, f32, f32); 30] = [
        (nan, 0.0, 1.0), (1.0, nan, 1.0), (-1.0, inf, 1.0), (-1.0, -inf, 1.0),
        (nan, 1.0, nan), (2.0, nan, nan), (-8.0, 1.0 / 3.0, nan), (-2.0, 3.0, -8.0),
        (-2.0, 2.0, 4.0), (-2.0, -1.0, -0.5), (0.0, -1.0, inf), (-0.0, -1.0, -inf),
        (-0.0, -2.0, inf), (-0.0, 3.0, -0.0), (-0.0, 2.0, 0.0), (0.0, 0.5, 0.0),
        (0.5, inf, 0.0), (0.5, -inf, inf), (2.0, inf, inf), (2.0, -inf, 0.0),
        (-inf, 3.0, -inf), (-inf, 2.0, inf), (-inf, -3.0, -0.0), (inf, -2.0, 0.0),
        (2.0, 128.0, inf), (2.0, -150.0, 0.0),
        // -inf to a non-integer power: inf above 0, +0 below (not NaN)
        (-inf, 2.5, inf), (-inf, 0.5, inf), (-inf, -2.5, 0.0), (-inf, -0.5, 0.0),
    ];
    let xs: Vec<f32> = cases.iter().map(|c| c.0).collect();
    let ys: Vec<f32> = cases.iter().map(|c| c.1).collect();
    let want: Vec<f32> = cases.iter().map(|c| c.2).collect();
    let (v, s) = k.run_both(&[&xs, &ys]);
    for got in [v, s] {
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                "pow({:e}, {:e}) = {g:e}, expected {w:e}",
                xs[i],
                ys[i]
            );
        }
        // Agrees with Rust's (C99) powf on every case.
        for (i, g) in got.iter().enumerate() {
            let w = xs[i].powf(ys[i]);
            assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()));
        }
    }
}

#[test]
fn special_values_exact() {
    let inf = f32::INFINITY;
    let nan = f32::NAN;
    let xs = [0.0, -0.0, inf, -inf, nan];
    type Row = (
        &'static str,
        fn(&mut FunctionBuilder, Value) -> Value,
        [f32; 5],
    );
    #[rustfmt::skip]
    let table: [Row; 15] = [
        ("exp", math::exp, [1.0, 1.0, inf, 0.0, nan]),
        ("expm1", math::expm1, [0.0, -0.0, inf, -1.0, nan]),
        ("log", math::log, [-inf, -inf, inf, nan, nan]),
        ("log1p", math::log1p, [0.0, -0.0, inf, nan, nan]),
        ("tanh", math::tanh, [0.0, -0.0, 1.0, -1.0, nan]),
        ("sigmoid", math::sigmoid, [0.5, 0.5, 1.0, 0.0, nan]),
        ("erf", math::erf, [0.0, -0.0, 1.0, -1.0, nan]),
        ("gelu", math::gelu, [0.0, -0.0, inf, nan, nan]),
        ("gelu_tanh", math::gelu_tanh, [0.0, -0.0, inf, nan, nan]),
        ("gelu_slope", math::gelu_slope, [0.5, 0.5, nan, nan, nan]),
        ("gelu_tanh_slope", math::gelu_tanh_slope, [0.5, 0.5, nan, nan, nan]),
        ("sin", math::sin, [0.0, -0.0, nan, nan, nan]),
        ("cos", math::cos, [1.0, 1.0, nan, nan, nan]),
        ("sqrt", math::sqrt, [0.0, -0.0, inf, nan, nan]),
        ("rsqrt", math::rsqrt, [inf, -inf, 0.0, nan, nan]),
    ];
    for (name, emit, want) in table {
        let got = eval1(name, emit, &xs);
        assert_same(name, &xs, &got, &want);
    }
}

#[test]
fn exp_overflow_underflow_edges() {
    // Largest x with finite exp, smallest with nonzero exp, and their neighbours.
    let xs = [
        88.722_83f32,
        88.722_84,
        -103.972_07,
        -103.972_09,
        -87.336_55,
        -87.336_54,
    ];
    let got = eval1("exp", math::exp, &xs);
    for (&x, &g) in xs.iter().zip(&got) {
        let want = (x as f64).exp() as f32;
        assert!(
            ulp_err(g, (x as f64).exp()) <= 1.0,
            "exp({x:e}) = {g:e}, want {want:e}"
        );
        assert_eq!(g.is_infinite(), want.is_infinite(), "exp({x:e})");
        assert_eq!(g == 0.0, want == 0.0, "exp({x:e})");
    }
}

#[test]
fn sin_cos_huge_arguments() {
    // Arguments near multiples of π/2 and at the top of the range (chunked reduction).
    let xs: Vec<f32> = [
        f32::MAX,
        -f32::MAX,
        1.0e38,
        1.6e30,
        2.0f32.powi(100),
        102_940.4,
        16_777_216.0,
        1_073_741_824.0,
        1_073_741_900.0,
        13_176_794.0,
        1.0e22,
    ]
    .into_iter()
    .collect();
    for (name, emit, reference) in [
        (
            "sin",
            math::sin as fn(&mut FunctionBuilder, Value) -> Value,
            f64::sin as fn(f64) -> f64,
        ),
        ("cos", math::cos, f64::cos),
    ] {
        let got = eval1(name, emit, &xs);
        for (&x, &g) in xs.iter().zip(&got) {
            let e = ulp_err(g, reference(x as f64));
            assert!(e <= 1.0, "{name}({x:e}) = {g:e}: {e} ulp");
        }
    }
}

#[test]
fn basic_arithmetic_is_exact() {
    type Bin = fn(&mut FunctionBuilder, Value, Value) -> Value;
    type Case = (&'static str, Bin, fn(f32, f32) -> f32);
    let ops: [Case; 4] = [
        ("add", |b, x, y| b.ins().fadd(x, y), |x, y| x + y),
        ("sub", |b, x, y| b.ins().fsub(x, y), |x, y| x - y),
        ("mul", |b, x, y| b.ins().fmul(x, y), |x, y| x * y),
        ("div", |b, x, y| b.ins().fdiv(x, y), |x, y| x / y),
    ];
    let xs = sweep();
    let mut ys = xs.clone();
    ys.rotate_left(12_345);
    for (name, emit, reference) in ops {
        let k = Kernel::new(name, 2, &move |b: &mut FunctionBuilder, v: &[Value]| {
            emit(b, v[0], v[1])
        });
        let (v, s) = k.run_both(&[&xs, &ys]);
        let want: Vec<f32> = xs.iter().zip(&ys).map(|(&x, &y)| reference(x, y)).collect();
        assert_same(name, &xs, &v, &want);
        assert_same(name, &xs, &s, &want);
    }
}

#[test]
fn jit_reports_misuse_as_errors() {
    let mut jit = Jit::new().unwrap();
    let sig = jit.signature(&[F32], &[F32]);
    let id = jit
        .define("id", Linkage::Export, &sig, &mut |fb| {
            let entry = fb.b.current_block().unwrap();
            let x = fb.b.block_params(entry)[0];
            fb.b.ins().return_(&[x]);
            Ok(())
        })
        .unwrap();
    assert!(jit.code_ptr(id).is_err(), "used before finalize");
    // Redefining a name and importing an unregistered symbol are errors, not panics.
    let again = jit.define("id", Linkage::Export, &sig, &mut |fb| {
        let entry = fb.b.current_block().unwrap();
        let x = fb.b.block_params(entry)[0];
        fb.b.ins().return_(&[x]);
        Ok(())
    });
    assert!(matches!(again, Err(smelt::Error::Unsupported(_))));
    assert!(jit.import("no_such_symbol", &sig).is_err());
    // Invalid IR (wrong return type) is rejected by the verifier.
    let bad = jit.define("bad", Linkage::Export, &sig, &mut |fb| {
        let v = fb.b.ins().iconst(I64, 1);
        fb.b.ins().return_(&[v]);
        Ok(())
    });
    assert!(matches!(bad, Err(smelt::Error::Unsupported(_))));
    jit.finalize().unwrap();
    let p = jit.code_ptr(id).unwrap();
    // SAFETY: `id` was defined as f32 -> f32 and `jit` is alive.
    let f: extern "C" fn(f32) -> f32 = unsafe { std::mem::transmute(p) };
    assert_eq!(f(2.5), 2.5);
}

#[test]
fn imported_symbol_is_callable() {
    extern "C" fn twice(x: f32) -> f32 {
        2.0 * x
    }
    let mut jit = Jit::with_symbols(&[("twice", twice as *const u8)]).unwrap();
    let sig = jit.signature(&[F32], &[F32]);
    let callee = jit.import("twice", &sig).unwrap();
    let id = jit
        .define("call_twice", Linkage::Export, &sig, &mut |fb| {
            let f = fb.func_ref(callee);
            let entry = fb.b.current_block().unwrap();
            let x = fb.b.block_params(entry)[0];
            let call = fb.b.ins().call(f, &[x]);
            let r = fb.b.inst_results(call)[0];
            fb.b.ins().return_(&[r]);
            Ok(())
        })
        .unwrap();
    jit.finalize().unwrap();
    // SAFETY: f32 -> f32 as defined; `jit` is alive.
    let f: extern "C" fn(f32) -> f32 = unsafe { std::mem::transmute(jit.code_ptr(id).unwrap()) };
    assert_eq!(f(1.25), 2.5);
}
