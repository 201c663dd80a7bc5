//! Cranelift kernels against the kernel-IR interpreter: every step of a fused schedule runs
//! through `compile_kernel` + `run_rows` (in chunks of rows), extern steps through the eager
//! op, and the outputs are compared with `kernel::interp::run` (itself checked against the
//! graph interpreter in tests/fusion.rs).

mod common;

use common::{Tol, assert_close, random_graph};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smelt::codegen_cpu::{CodegenOptions, compile_kernel};
use smelt::dispatch;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::graph::{Graph, ValueId};
use smelt::ir::op::{BinaryOp, Op, ReduceOp, ScatterReduction, TensorType, UnaryOp};
use smelt::kernel::{BufferKind, Expr, Schedule, Step, View};
use smelt::passes::compile;
use smelt::runtime::apply;
use smelt::{DType, Result, Scalar, Tensor};

const ALL: [DType; 10] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I64,
    DType::I32,
    DType::I16,
    DType::I8,
    DType::U8,
    DType::Bool,
];

// ---- harness ------------------------------------------------------------------------------

/// Little-endian bytes of a slice, in 8-byte words (aligned for every dtype).
fn words_of<T: Copy>(v: &[T]) -> Vec<u64> {
    let n = std::mem::size_of_val(v);
    let mut w = vec![0u64; n.div_ceil(8).max(1)];
    // SAFETY: `w` holds at least `n` bytes; `T` is plain data.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, w.as_mut_ptr() as *mut u8, n) };
    w
}

fn tensor_words(t: &Tensor) -> Vec<u64> {
    dispatch!(t.dtype(), T => words_of(&t.to_vec::<T>().unwrap()))
}

/// The strided view `v` of a buffer held in `w`, as a new contiguous tensor.
fn gather(w: &[u64], dtype: DType, shape: &[usize], strides: &[usize], offset: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    dispatch!(dtype, T => {
        let p = w.as_ptr() as *const T;
        let mut out: Vec<T> = Vec::with_capacity(n);
        for _ in 0..n {
            let o = offset + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
            // SAFETY: views are validated to stay inside their buffer.
            out.push(unsafe { *p.add(o) });
            for d in (0..shape.len()).rev() {
                idx[d] += 1;
                if idx[d] < shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        Tensor::from_vec(out, shape).unwrap()
    })
}

fn view(mem: &[Vec<u64>], s: &Schedule, v: &View) -> Tensor {
    let d = s.buffers[v.buffer].dtype;
    gather(&mem[v.buffer], d, &v.shape, &v.strides, v.offset)
}

/// Runs `s` with compiled kernels, each over its rows in `chunks` pieces.
fn run_compiled(
    s: &Schedule,
    inputs: &[Tensor],
    chunks: usize,
    opts: &CodegenOptions,
) -> Result<Vec<Tensor>> {
    s.validate()?;
    let mut mem: Vec<Vec<u64>> = Vec::new();
    for b in &s.buffers {
        mem.push(match &b.kind {
            BufferKind::Input(k) => {
                let t = &inputs[*k];
                assert_eq!((t.dtype(), t.shape()), (b.dtype, b.shape.as_slice()));
                tensor_words(t)
            }
            BufferKind::Constant(lit) => words_of(&lit.bytes[..]),
            BufferKind::Temp => vec![0u64; b.bytes().div_ceil(8).max(1)],
        });
    }
    for step in &s.steps {
        match step {
            Step::Kernel(k) => {
                let ck = compile_kernel(k, &s.buffers, opts)?;
                let ptrs: Vec<*mut u8> =
                    mem.iter_mut().map(|w| w.as_mut_ptr() as *mut u8).collect();
                let rows = ck.rows();
                let mut start = 0;
                for c in 0..chunks {
                    let end = rows * (c + 1) / chunks;
                    // SAFETY: every pointer holds its whole buffer.
                    unsafe { ck.run_rows(&ptrs, start, end)? };
                    start = end;
                }
            }
            Step::Extern(e) => {
                let args: Vec<Tensor> = e.args.iter().map(|v| view(&mem, s, v)).collect();
                let refs: Vec<&Tensor> = args.iter().collect();
                let r = apply(e.op.clone(), &refs)?;
                mem[e.out] = tensor_words(&r);
            }
            Step::Control(c) => {
                return Err(smelt::Error::Unsupported(format!(
                    "this harness runs kernels and externs, not {}",
                    c.control.name()
                )));
            }
        }
    }
    Ok(s.outputs.iter().map(|v| view(&mem, s, v)).collect())
}

/// Graphs with a softmax: a few ulps per exponential, divided by a sum.
const SOFTMAX_TOL: Tol = Tol::rel(1e-6).or_ulps(16);

/// Compiles `g`, runs it compiled (in 1 and 3 chunks) and interpreted, and compares.
fn check_with(g: &Graph, ins: &[Tensor], tol: Tol) -> Schedule {
    let s = compile(g).unwrap_or_else(|e| panic!("compile {}: {e}", g.name));
    let want =
        smelt::kernel::interp::run(&s, ins).unwrap_or_else(|e| panic!("interp {}: {e}", g.name));
    for chunks in [1, 3] {
        let got = run_compiled(&s, ins, chunks, &CodegenOptions::default())
            .unwrap_or_else(|e| panic!("run {}: {e}\n{s}", g.name));
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_close(
                a,
                b,
                tol.for_dtype(b.dtype()),
                &format!("{} output {i} ({chunks} chunks)\n{s}", g.name),
            );
        }
    }
    s
}

// ---- inputs -------------------------------------------------------------------------------

const SPECIALS: [f64; 10] = [
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
    -0.0,
    0.0,
    0.5,
    -2.5,
    1e10,
    -1e10,
    300.7,
];

/// Values of `dtype` and `shape`: random, with special values first for floats.
fn values(rng: &mut StdRng, dtype: DType, shape: &[usize], specials: bool) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|i| {
            if specials && dtype.is_float() && i < SPECIALS.len() && n > 20 {
                SPECIALS[i]
            } else if dtype.is_float() {
                rng.random_range(-4.0..4.0)
            } else if dtype == DType::Bool {
                f64::from(rng.random_bool(0.5) as u8)
            } else if dtype == DType::U8 {
                rng.random_range(0..256) as f64
            } else {
                rng.random_range(-120..120) as f64
            }
        })
        .collect();
    let t = Tensor::from_vec(v, shape).unwrap();
    apply(Op::To { dtype }, &[&t]).unwrap()
}

fn nonzero(t: &Tensor) -> Tensor {
    let one = Tensor::from_vec(vec![true], &[]).unwrap();
    let z = apply(Op::Scalar(Scalar::Int(0)), &[]).unwrap();
    let is0 = apply(Op::Binary(BinaryOp::Eq), &[t, &z]).unwrap();
    let three = apply(Op::Scalar(Scalar::Int(3)), &[]).unwrap();
    let _ = one;
    apply(
        Op::Where,
        &[
            &is0,
            &apply(Op::To { dtype: t.dtype() }, &[&three]).unwrap(),
            t,
        ],
    )
    .unwrap()
}

fn input(g: &mut Graph, name: &str, dtype: DType, shape: &[usize]) -> ValueId {
    g.add_input(name, TensorType::new(dtype, shape.to_vec()))
        .unwrap()
}

/// Every unary op at its defaults, plus the other form of gelu and other attributes.
fn unary_ops() -> Vec<UnaryOp> {
    use smelt::ir::unary::Real;
    let mut v = UnaryOp::ALL.to_vec();
    v.extend([
        UnaryOp::Gelu { tanh: true },
        UnaryOp::GeluSlope { tanh: true },
        UnaryOp::LeakyRelu {
            negative_slope: Real(-0.3),
        },
        UnaryOp::Softplus {
            beta: Real(2.0),
            threshold: Real(1.0),
        },
        UnaryOp::Hardtanh {
            min_val: Real(-0.25),
            max_val: Real(3.0),
        },
    ]);
    v
}

const BINARY: [BinaryOp; 19] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Pow,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
    BinaryOp::Remainder,
    BinaryOp::Eq,
    BinaryOp::Ne,
    BinaryOp::Lt,
    BinaryOp::Le,
    BinaryOp::Gt,
    BinaryOp::Ge,
    BinaryOp::LogicalAnd,
    BinaryOp::LogicalOr,
    BinaryOp::BitwiseAnd,
    BinaryOp::BitwiseOr,
    BinaryOp::BitwiseXor,
];

/// f32 transcendentals are polynomials (≤ 4.5 ulp, see codegen_cpu::math); everything else
/// must match exactly.
fn unary_tol(u: UnaryOp) -> Tol {
    use UnaryOp::*;
    match u {
        Exp | Log | Log1p | Expm1 | Sin | Cos | Tanh | Sigmoid | Gelu { .. } | Silu | Erf => {
            Tol::ulps(6)
        }
        // a few ulps of the terms, which cancel where the slope crosses 0 (x ≈ -0.75)
        GeluSlope { .. } => Tol::rel(1e-6).or_ulps(6),
        // formulas of up to three polynomials and a few roundings
        Elu { .. } | Softplus { .. } | Mish | LogSigmoid => Tol::ulps(16),
        // rsqrt rounds twice; the slope is an f32 constant; `x * y / 6` rounds three times
        Rsqrt | LeakyRelu { .. } | Hardswish => Tol::ulps(3),
        Neg
        | Abs
        | Sqrt
        | Relu
        | Floor
        | Ceil
        | Round
        | Sign
        | Reciprocal
        | Square
        | LogicalNot
        | IsNan
        | BitwiseNot
        | Hardtanh { .. } => Tol::EXACT,
        // the f64 reference formula, rounded once, on every backend
        Asin | Acos | Atan => Tol::EXACT,
    }
}

// ---- pointwise ops ------------------------------------------------------------------------

#[test]
fn every_unary_op_in_every_dtype() {
    let mut rng = StdRng::seed_from_u64(1);
    for u in unary_ops() {
        for d in ALL {
            if u.out_dtype(d).is_err() {
                continue;
            }
            // 37 elements: two vector iterations and a tail; 4097 for f32 only
            for shape in [&[37usize][..], &[4097], &[], &[0]] {
                if shape == [4097] && d != DType::F32 {
                    continue;
                }
                let mut g = Graph::new(&format!("{}_{d}", u.name()));
                let x = input(&mut g, "x", d, shape);
                let y = g.add_op(Op::Unary(u), &[x]).unwrap();
                g.set_outputs(vec![y]);
                let ins = vec![values(&mut rng, d, shape, true)];
                check_with(&g, &ins, unary_tol(u));
            }
        }
    }
}

#[test]
fn every_binary_op_in_every_dtype_with_broadcast() {
    let mut rng = StdRng::seed_from_u64(2);
    for b in BINARY {
        for d in ALL {
            let mut g = Graph::new(&format!("{}_{d}", b.name()));
            let x = input(&mut g, "x", d, &[5, 23]);
            let y = input(&mut g, "y", d, &[23]);
            let Ok(r) = g.add_op(Op::Binary(b), &[x, y]) else {
                continue;
            };
            g.set_outputs(vec![r]);
            let xv = values(&mut rng, d, &[5, 23], true);
            let mut yv = values(&mut rng, d, &[23], true);
            if !d.is_float() && b == BinaryOp::Remainder {
                yv = nonzero(&yv);
            }
            let tol = if b == BinaryOp::Pow && d == DType::F32 {
                Tol::ulps(1)
            } else {
                Tol::EXACT
            };
            check_with(&g, &[xv, yv], tol);
        }
    }
}

/// `scatter_reduce` between fused pointwise ops, every reduction, with duplicate indices,
/// dims of 1 and an empty index.
#[test]
fn scatter_reduce_between_fused_ops() {
    let mut rng = StdRng::seed_from_u64(5);
    let cases: [(&[usize], &[usize], i64); 3] = [
        (&[5, 3], &[7, 2], 0),
        (&[1, 6], &[1, 9], 1),
        (&[4], &[0], 0),
    ];
    for reduce in ScatterReduction::ALL {
        for d in [DType::F32, DType::F64, DType::I64] {
            for (xs, is, dim) in cases {
                let mut g = Graph::new(&format!("scatter_{}_{d}", reduce.name()));
                let x = input(&mut g, "x", d, xs);
                let i = input(&mut g, "i", DType::I64, is);
                let s = input(&mut g, "s", d, is);
                let sq = g.add_op(Op::Unary(UnaryOp::Abs), &[s]).unwrap();
                let y = g
                    .add_op(Op::ScatterReduce { dim, reduce }, &[x, i, sq])
                    .unwrap();
                let z = g.add_op(Op::Unary(UnaryOp::Neg), &[y]).unwrap();
                g.set_outputs(vec![z]);
                let size = xs[dim as usize] as i64;
                let n: usize = is.iter().product();
                let iv: Vec<i64> = (0..n).map(|_| rng.random_range(0..size)).collect();
                let ins = vec![
                    values(&mut rng, d, xs, false),
                    Tensor::from_vec(iv, is).unwrap(),
                    values(&mut rng, d, is, false),
                ];
                check_with(&g, &ins, Tol::EXACT);
                // the JIT's own executor against the eager ops
                let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
                let got = f.call(&ins).unwrap();
                let want = apply(Op::Unary(UnaryOp::Abs), &[&ins[2]])
                    .and_then(|a| ins[0].scatter_reduce(dim, &ins[1], &a, reduce.name()))
                    .and_then(|y| y.neg())
                    .unwrap();
                assert_close(&got[0], &want, Tol::EXACT, &g.name);
            }
        }
    }
}

/// `view(dtype)` reads the bytes as another dtype of the same size: clearing the sign
/// bit of a float's integer view is `abs`, compiled between fused ops.
#[test]
fn view_dtype_reads_the_bits() {
    for (f, i, mask) in [
        ("f32", "i32", "2147483647"),
        ("f64", "i64", "9223372036854775807"),
    ] {
        let text = format!(
            "graph g(%x: {f}[3,5]) {{\n  %n = neg(%x)\n  %t = t(%n)\n  %b = view(%t, dtype={i})\n  %m = bitwise_and(%b, {mask})\n  %y = view(%m, dtype={f})\n  return %y, %b\n}}\n"
        );
        let g = smelt::ir::text::parse_module(&text, "g")
            .unwrap()
            .graphs
            .remove(0);
        let d = g.node(g.inputs()[0]).ty.dtype;
        let mut v: Vec<f64> = (0..15).map(|k| k as f64 * 0.37 - 2.5).collect();
        v[0] = 1.0;
        v[1] = -0.0;
        v[2] = f64::INFINITY;
        let x = Tensor::from_vec(v, &[3, 5]).unwrap().to_dtype(d).unwrap();
        let c = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
        let got = c.call(std::slice::from_ref(&x)).unwrap();
        let want = x.t().unwrap().abs().unwrap();
        assert_close(&got[0], &want, Tol::EXACT, f);
        // -1.0's bits: the sign and the exponent bias
        let first = got[1]
            .to_dtype(DType::I64)
            .unwrap()
            .to_vec::<i64>()
            .unwrap()[0];
        let want_bits = if f == "f32" {
            i64::from((-1.0f32).to_bits() as i32)
        } else {
            (-1.0f64).to_bits() as i64
        };
        assert_eq!(first, want_bits, "{f}");
    }
    // dtypes of other sizes are refused by the shape rule
    let e = smelt::ir::text::parse_module(
        "graph g(%x: f32[2]) {\n  %y = view(%x, dtype=f16)\n  return %y\n}\n",
        "g",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("same size"), "{e}");
}

#[test]
fn casts_between_all_dtypes() {
    let mut rng = StdRng::seed_from_u64(3);
    let specials = [
        f64::NAN,
        f64::INFINITY,
        -1e10,
        1e10,
        -0.5,
        0.7,
        255.5,
        256.0,
        300.0,
        -129.0,
        65519.0,
        65520.0,
        1.0 + 2f64.powi(-11) + 2f64.powi(-30),
        3.0e38,
        -0.0,
        1.0,
    ];
    for from in ALL {
        for to in ALL {
            let mut g = Graph::new(&format!("cast_{from}_{to}"));
            let x = input(&mut g, "x", from, &[41]);
            let y = g.add_op(Op::To { dtype: to }, &[x]).unwrap();
            let z = g.add_op(Op::Unary(UnaryOp::Abs), &[y]);
            let out = match z {
                Ok(z) if to != DType::Bool && to != DType::U8 => vec![y, z],
                _ => vec![y],
            };
            g.set_outputs(out);
            let mut v: Vec<f64> = specials.to_vec();
            v.extend((0..41 - specials.len()).map(|_| rng.random_range(-300.0..300.0)));
            let t = Tensor::from_vec(v, &[41]).unwrap();
            let t = apply(Op::To { dtype: from }, &[&t]).unwrap();
            check_with(&g, &[t], Tol::EXACT);
        }
    }
}

#[test]
fn where_clamp_masked_fill_and_scalars() {
    let mut rng = StdRng::seed_from_u64(4);
    for d in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::I32,
        DType::U8,
        DType::I64,
    ] {
        let mut g = Graph::new(&format!("wcm_{d}"));
        let x = input(&mut g, "x", d, &[3, 37]);
        let y = input(&mut g, "y", d, &[37]);
        let m = input(&mut g, "m", DType::Bool, &[3, 1]);
        let c = g.add_op(Op::Binary(BinaryOp::Gt), &[x, y]).unwrap();
        let w = g.add_op(Op::Where, &[c, x, y]).unwrap();
        let cl = g
            .add_op(
                Op::Clamp {
                    min: Some(Scalar::Int(2)),
                    max: Some(Scalar::Float(50.5)),
                },
                &[w],
            )
            .unwrap();
        let lo = g
            .add_op(
                Op::Clamp {
                    min: Some(Scalar::Int(1)),
                    max: None,
                },
                &[x],
            )
            .unwrap();
        let f = g
            .add_op(
                Op::MaskedFill {
                    value: Scalar::Int(7),
                },
                &[cl, m],
            )
            .unwrap();
        let s = g.add_scalar(Scalar::Float(2.5)).unwrap();
        let k = g.add_op(Op::Binary(BinaryOp::Mul), &[f, s]).unwrap();
        g.set_outputs(vec![f, k, lo]);
        let ins = vec![
            values(&mut rng, d, &[3, 37], true),
            values(&mut rng, d, &[37], true),
            values(&mut rng, DType::Bool, &[3, 1], false),
        ];
        check_with(&g, &ins, Tol::EXACT);
    }
}

#[test]
fn clamp_with_nan_bounds_and_out_of_range_bounds() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut g = Graph::new("clamp_nan");
    let x = input(&mut g, "x", DType::F32, &[40]);
    let a = g
        .add_op(
            Op::Clamp {
                min: Some(Scalar::Float(f64::NAN)),
                max: Some(Scalar::Float(1.0)),
            },
            &[x],
        )
        .unwrap();
    let b = g
        .add_op(
            Op::Clamp {
                min: Some(Scalar::Float(-1.0)),
                max: None,
            },
            &[x],
        )
        .unwrap();
    g.set_outputs(vec![a, b]);
    check_with(&g, &[values(&mut rng, DType::F32, &[40], true)], Tol::EXACT);

    let mut g = Graph::new("clamp_overflow");
    let x = input(&mut g, "x", DType::I8, &[4]);
    let a = g
        .add_op(
            Op::Clamp {
                min: Some(Scalar::Int(1000)),
                max: None,
            },
            &[x],
        )
        .unwrap();
    g.set_outputs(vec![a]);
    let s = compile(&g).unwrap();
    let t = values(&mut rng, DType::I8, &[4], false);
    let e = run_compiled(&s, &[t], 1, &CodegenOptions::default()).unwrap_err();
    assert!(e.to_string().contains("without overflow"), "{e}");
}

#[test]
fn non_contiguous_inputs_and_odd_sizes() {
    let mut rng = StdRng::seed_from_u64(6);
    for n in [1usize, 7, 4097] {
        let mut g = Graph::new("views");
        let x = input(&mut g, "x", DType::F32, &[n, 3]);
        let xt = g.add_op(Op::T, &[x]).unwrap(); // [3, n]
        let y = input(&mut g, "y", DType::F32, &[3, 2 * n]);
        let ys = g
            .add_op(
                Op::Slice {
                    dim: 1,
                    start: Some(0),
                    end: None,
                    step: 2,
                },
                &[y],
            )
            .unwrap(); // [3, n]
        let z = input(&mut g, "z", DType::F32, &[1, n]);
        let ze = g
            .add_op(
                Op::Expand {
                    size: vec![3, n as i64],
                },
                &[z],
            )
            .unwrap();
        let a = g.add_op(Op::Binary(BinaryOp::Add), &[xt, ys]).unwrap();
        let m = g.add_op(Op::Binary(BinaryOp::Mul), &[a, ze]).unwrap();
        let e = g.add_op(Op::Unary(UnaryOp::Exp), &[m]).unwrap();
        g.set_outputs(vec![m, e]);
        let ins = vec![
            values(&mut rng, DType::F32, &[n, 3], false),
            values(&mut rng, DType::F32, &[3, 2 * n], false),
            values(&mut rng, DType::F32, &[1, n], false),
        ];
        check_with(&g, &ins, Tol::ulps(6));
    }
}

// ---- row kernels --------------------------------------------------------------------------

fn reduce_graph(op: Op, d: DType, shape: &[usize]) -> Graph {
    let mut g = Graph::new(op.name());
    let x = input(&mut g, "x", d, shape);
    let y = g.add_op(op, &[x]).unwrap();
    g.set_outputs(vec![y]);
    g
}

/// Tolerance of reductions and normalisations computed in dtype `d`.
fn reduction_tol(d: DType) -> Tol {
    match d {
        DType::F32 => Tol::rel(1e-6).or_ulps(8),
        DType::F64 => Tol::rel(1e-12),
        // one rounding of the half result may land on the other side
        _ => Tol::rel(1e-2),
    }
}

#[test]
fn reductions_and_normalisations() {
    let mut rng = StdRng::seed_from_u64(7);
    let red = |op, dim: i64| Op::Reduce {
        op,
        dim: Some(vec![dim]),
        keepdim: false,
    };
    for d in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for shape in [
            &[5usize, 37][..],
            &[3, 4097],
            &[1, 1],
            &[4, 0],
            &[0, 3],
            &[7],
        ] {
            let last = shape.len() as i64 - 1;
            let mut ops = vec![
                red(ReduceOp::Sum, last),
                red(ReduceOp::Mean, last),
                red(ReduceOp::Sum, 0),
                red(ReduceOp::Prod, last),
                red(ReduceOp::All, last),
                red(ReduceOp::Any, 0),
                Op::Softmax { dim: -1 },
                Op::LogSoftmax { dim: -1 },
                Op::Var {
                    dim: Some(vec![-1]),
                    correction: 1.0,
                    keepdim: true,
                },
            ];
            if !shape.contains(&0) {
                ops.extend([
                    red(ReduceOp::Amax, last),
                    red(ReduceOp::Amin, 0),
                    Op::ArgMax {
                        dim: Some(-1),
                        keepdim: false,
                    },
                    Op::ArgMin {
                        dim: Some(0),
                        keepdim: true,
                    },
                ]);
            }
            if shape.len() == 2 {
                ops.push(Op::LayerNorm {
                    normalized_shape: vec![shape[1]],
                    eps: 1e-5,
                    has_weight: false,
                    has_bias: false,
                });
            }
            for op in ops {
                let g = reduce_graph(op.clone(), d, shape);
                let ins = vec![values(&mut rng, d, shape, false)];
                check_with(&g, &ins, reduction_tol(d));
            }
        }
    }
}

#[test]
fn reductions_with_nan_and_integer_dtypes() {
    let mut rng = StdRng::seed_from_u64(8);
    for d in [
        DType::F32,
        DType::I32,
        DType::U8,
        DType::I64,
        DType::Bool,
        DType::I8,
    ] {
        for op in [
            Op::Reduce {
                op: ReduceOp::Sum,
                dim: Some(vec![1]),
                keepdim: false,
            },
            Op::Reduce {
                op: ReduceOp::Amax,
                dim: Some(vec![1]),
                keepdim: false,
            },
            Op::Reduce {
                op: ReduceOp::Amin,
                dim: Some(vec![0]),
                keepdim: false,
            },
            Op::Reduce {
                op: ReduceOp::Prod,
                dim: Some(vec![1]),
                keepdim: false,
            },
            Op::Reduce {
                op: ReduceOp::Any,
                dim: Some(vec![1]),
                keepdim: false,
            },
            Op::ArgMax {
                dim: Some(1),
                keepdim: false,
            },
            Op::ArgMin {
                dim: Some(1),
                keepdim: false,
            },
        ] {
            if (op.name() == "sum" || op.name().starts_with("arg")) && d == DType::Bool {
                continue;
            }
            let g = reduce_graph(op, d, &[4, 33]);
            // specials in row 0 (NaN first, then infinities) for floats
            let t = values(&mut rng, d, &[4, 33], true);
            check_with(&g, &[t], Tol::rel(1e-6));
        }
    }
}

#[test]
fn zero_dim_tensors() {
    let mut rng = StdRng::seed_from_u64(9);
    let mut g = Graph::new("zero_dim");
    let x = input(&mut g, "x", DType::F32, &[]);
    let y = input(&mut g, "y", DType::F32, &[6]);
    let a = g.add_op(Op::Binary(BinaryOp::Mul), &[x, y]).unwrap();
    let s = g
        .add_op(
            Op::Reduce {
                op: ReduceOp::Sum,
                dim: None,
                keepdim: false,
            },
            &[a],
        )
        .unwrap();
    let e = g.add_op(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    g.set_outputs(vec![a, s, e]);
    let ins = vec![
        values(&mut rng, DType::F32, &[], false),
        values(&mut rng, DType::F32, &[6], false),
    ];
    check_with(&g, &ins, Tol::rel(1e-6).or_ulps(4));
}

// ---- errors, threads, cache ---------------------------------------------------------------

#[test]
fn integer_remainder_by_zero_is_an_error() {
    for d in [DType::I32, DType::I64, DType::U8, DType::I8] {
        let mut g = Graph::new("rem0");
        let x = input(&mut g, "x", d, &[9]);
        let y = input(&mut g, "y", d, &[9]);
        let r = g.add_op(Op::Binary(BinaryOp::Remainder), &[x, y]).unwrap();
        g.set_outputs(vec![r]);
        let s = compile(&g).unwrap();
        let xv = Tensor::from_vec(vec![5i64, -7, 3, 0, 8, -128, 127, 1, 2], &[9]).unwrap();
        let yv = Tensor::from_vec(vec![2i64, 3, -1, 4, 0, -1, 5, 1, 1], &[9]).unwrap();
        let to = |t: &Tensor| apply(Op::To { dtype: d }, &[t]).unwrap();
        let e = run_compiled(&s, &[to(&xv), to(&yv)], 1, &CodegenOptions::default()).unwrap_err();
        assert!(e.to_string().contains("ZeroDivisionError"), "{e}");
        assert!(smelt::kernel::interp::run(&s, &[to(&xv), to(&yv)]).is_err());
        // without the zero, MIN % -1 and the Python sign rule
        let yv = Tensor::from_vec(vec![2i64, 3, -1, 4, 7, -1, 5, 1, 1], &[9]).unwrap();
        check_with(&g, &[to(&xv), to(&yv)], Tol::EXACT);
    }
}

#[test]
fn run_rows_checks_its_arguments_and_the_cache_shares_kernels() {
    let mut g = Graph::new("args");
    let x = input(&mut g, "x", DType::F32, &[8, 3]);
    let y = g.add_op(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    g.set_outputs(vec![y]);
    let s = compile(&g).unwrap();
    let Step::Kernel(k) = &s.steps[0] else {
        panic!("one kernel expected")
    };
    let opts = CodegenOptions::default();
    let a = compile_kernel(k, &s.buffers, &opts).unwrap();
    let mut renamed = k.clone();
    renamed.name = "other".into();
    let b = compile_kernel(&renamed, &s.buffers, &opts).unwrap();
    assert!(a.shares_code(&b), "a renamed kernel is the same kernel");
    let fast = compile_kernel(
        k,
        &s.buffers,
        &CodegenOptions {
            f32_lane_sums: true,
            ..CodegenOptions::default()
        },
    )
    .unwrap();
    assert!(!a.shares_code(&fast));
    assert_eq!(a.rows(), 24);
    assert_eq!(a.vector_loops(), 1, "a dense f32 relu is one vector loop");
    let mut mem = vec![vec![0f32; 24]; s.buffers.len()];
    let ptrs: Vec<*mut u8> = mem.iter_mut().map(|v| v.as_mut_ptr() as *mut u8).collect();
    // SAFETY: each pointer holds its whole buffer (24 f32s, owned by `mem`); one pointer
    // short, the call is refused before the kernel runs.
    let e = unsafe { a.run_rows(&ptrs[..ptrs.len() - 1], 0, 1) }.unwrap_err();
    assert!(e.to_string().contains("buffer pointers"), "{e}");
    // SAFETY: as above; rows 3..2 are refused before the kernel runs.
    let e = unsafe { a.run_rows(&ptrs, 3, 2) }.unwrap_err();
    assert!(e.to_string().contains("out of"), "{e}");
    // SAFETY: as above; rows past the kernel's 24 are refused before it runs.
    let e = unsafe { a.run_rows(&ptrs, 0, 25) }.unwrap_err();
    assert!(e.to_string().contains("out of"), "{e}");
}

#[test]
fn kernels_equal_up_to_their_buffers_share_code() {
    // unfused: one kernel per op, each on its own buffers
    let mut g = Graph::new("chain");
    let x = input(&mut g, "x", DType::F32, &[5, 7]);
    let h = input(&mut g, "h", DType::F64, &[5, 7]);
    let relu = |g: &mut Graph, v| g.add_op(Op::Unary(UnaryOp::Relu), &[v]).unwrap();
    let a = relu(&mut g, x);
    let b = relu(&mut g, a);
    let c = g.add_op(Op::Unary(UnaryOp::Exp), &[b]).unwrap();
    let d = relu(&mut g, c);
    let e = relu(&mut g, h);
    g.set_outputs(vec![d, e]);
    let f = CompiledFn::compile(&g, &CompileOptions::default().fused(false)).unwrap();
    let s = f.schedule();
    let opts = CodegenOptions::default();
    // (is it the exp, its dtype, its code) per kernel
    let ks: Vec<_> = s
        .steps
        .iter()
        .map(|st| match st {
            Step::Kernel(k) => (
                k.values
                    .iter()
                    .any(|v| matches!(v.expr, Expr::Unary(UnaryOp::Exp, _))),
                k.values[0].dtype,
                compile_kernel(k, &s.buffers, &opts).unwrap(),
            ),
            Step::Extern(_) | Step::Control(_) => panic!("only kernels expected"),
        })
        .collect();
    assert_eq!(ks.len(), 5);
    let relus: Vec<_> = ks
        .iter()
        .filter(|k| !k.0 && k.1 == DType::F32)
        .map(|k| &k.2)
        .collect();
    assert_eq!(relus.len(), 3);
    assert!(
        relus[0].shares_code(relus[1]) && relus[1].shares_code(relus[2]),
        "the f32 relus compile once"
    );
    for (exp, dtype, k) in &ks {
        if *exp || *dtype != DType::F32 {
            assert!(!k.shares_code(relus[0]), "{k:?} is another kernel");
        }
    }
    // and the shared code reads each kernel's own buffers
    let xs = Tensor::randn(&[5, 7], Some(DType::F32)).unwrap();
    let hs = Tensor::randn(&[5, 7], Some(DType::F64)).unwrap();
    let got = f.call(&[xs.clone(), hs.clone()]).unwrap();
    // exp in f64, for each element of relu(x)
    let want_d: Vec<f64> = xs
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| f64::from(v.max(0.0)).exp())
        .collect();
    for (g, w) in got[0].to_vec::<f32>().unwrap().iter().zip(&want_d) {
        assert!(
            (f64::from(*g) - w).abs() <= 4.0 * f64::from(f32::EPSILON) * w,
            "{g} vs {w}"
        );
    }
    assert_eq!(
        got[1].to_vec::<f64>().unwrap(),
        hs.relu().unwrap().to_vec::<f64>().unwrap()
    );
}

/// Raw buffer pointers handed to worker threads.
struct Ptrs(Vec<*mut u8>);
// SAFETY: the threads write disjoint rows of the output and only read the inputs.
unsafe impl Send for Ptrs {}
// SAFETY: as for `Send`; shared, the vector of pointers itself is only read.
unsafe impl Sync for Ptrs {}

#[test]
fn one_kernel_runs_on_several_threads_at_once() {
    let mut rng = StdRng::seed_from_u64(10);
    let mut g = Graph::new("softmax_threads");
    let x = input(&mut g, "x", DType::F32, &[64, 129]);
    // scaled, as in attention: a plain softmax is one row-helper call per row
    let half = g.add_scalar(Scalar::Float(0.5)).unwrap();
    let xs = g.add_op(Op::Binary(BinaryOp::Mul), &[x, half]).unwrap();
    let y = g.add_op(Op::Softmax { dim: -1 }, &[xs]).unwrap();
    g.set_outputs(vec![y]);
    let s = compile(&g).unwrap();
    assert_eq!(s.kernel_count(), 1);
    let Step::Kernel(k) = &s.steps[0] else {
        panic!("one kernel expected")
    };
    let ck = compile_kernel(k, &s.buffers, &CodegenOptions::default()).unwrap();
    // max pass, sum pass and the stores all run on F32X4 lanes (the sum pass in strips
    // where native helpers take the exponentials)
    assert_eq!(ck.vector_loops() + ck.strip_loops(), 3);
    let xv = values(&mut rng, DType::F32, &[64, 129], false);
    let mut mem: Vec<Vec<u64>> = s
        .buffers
        .iter()
        .map(|b| match b.kind {
            BufferKind::Input(_) => tensor_words(&xv),
            _ => vec![0; b.bytes().div_ceil(8)],
        })
        .collect();
    let ptrs = Ptrs(mem.iter_mut().map(|w| w.as_mut_ptr() as *mut u8).collect());
    let rows = ck.rows();
    std::thread::scope(|sc| {
        for t in 0..4 {
            let (ck, ptrs) = (&ck, &ptrs);
            sc.spawn(move || {
                for rep in 0..20 {
                    let (b, e) = (rows * t / 4, rows * (t + 1) / 4);
                    let _ = rep;
                    // SAFETY: disjoint row ranges; buffers outlive the scope.
                    unsafe { ck.run_rows(&ptrs.0, b, e).unwrap() };
                }
            });
        }
    });
    let got = view(&mem, &s, &s.outputs[0]);
    let want = smelt::kernel::interp::run(&s, &[xv]).unwrap();
    assert_close(&got, &want[0], Tol::rel(1e-6).or_ulps(8), "threads");
}

/// Every output of `s` run compiled with strips and with inline math: (strips, inline), and
/// the strip loops of its kernels.
fn strips_and_inline(s: &Schedule, ins: &[Tensor]) -> (Vec<Tensor>, Vec<Tensor>, usize) {
    let inline = CodegenOptions {
        inline_math: true,
        ..CodegenOptions::default()
    };
    let strips = run_compiled(s, ins, 3, &CodegenOptions::default()).unwrap();
    let plain = run_compiled(s, ins, 3, &inline).unwrap();
    let mut loops = 0;
    for step in &s.steps {
        if let Step::Kernel(k) = step {
            let ck = compile_kernel(k, &s.buffers, &CodegenOptions::default()).unwrap();
            loops += ck.strip_loops();
            let ci = compile_kernel(k, &s.buffers, &inline).unwrap();
            assert_eq!(ci.strip_loops(), 0, "inline math never strips");
        }
    }
    (strips, plain, loops)
}

#[test]
fn transcendentals_run_in_strips_with_the_inline_results() {
    let strips_here = smelt::codegen_cpu::vmath::available();
    let mut rng = StdRng::seed_from_u64(12);
    // strips of 512: one short strip, a strip and a tail, several strips; empty and 1
    for u in [
        UnaryOp::Exp,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Silu,
        UnaryOp::Gelu { tanh: true },
    ] {
        for shape in [&[7usize][..], &[3, 1030], &[2, 1, 1543], &[1], &[0]] {
            let mut g = Graph::new(&format!("strip_{}", u.name()));
            let x = input(&mut g, "x", DType::F32, shape);
            let y = g.add_op(Op::Unary(u), &[x]).unwrap();
            // a cheap op after it: the body reads the helper's row back
            let z = g.add_op(Op::Binary(BinaryOp::Mul), &[y, x]).unwrap();
            // alone, the helper reads the input and writes the output directly
            g.set_outputs(if shape.len() == 2 {
                vec![y]
            } else {
                vec![y, z]
            });
            let ins = vec![values(&mut rng, DType::F32, shape, true)];
            let s = check_with(&g, &ins, Tol::ulps(8));
            let (a, b, loops) = strips_and_inline(&s, &ins);
            for (a, b) in a.iter().zip(&b) {
                let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
                for ((x, p), q) in ins[0].to_f64_vec().iter().zip(&a).zip(&b) {
                    assert!(
                        p.to_bits() == q.to_bits() || p.is_nan() && q.is_nan(),
                        "{}({x:e}) {shape:?}: strips {p:e}, inline {q:e}",
                        u.name()
                    );
                }
            }
            // (a single element has no innermost loop to strip)
            if strips_here && shape.iter().product::<usize>() > 1 {
                assert!(loops > 0, "{} {shape:?}: no strip loop\n{s}", u.name());
            }
        }
    }
    // softmax (row cache + strip), a nested pair in a row sum, a strided input (no strips)
    let shape = [33usize, 517];
    let mut g = Graph::new("strip_mix");
    let x = input(&mut g, "x", DType::F32, &shape);
    let sm = g.add_op(Op::Softmax { dim: -1 }, &[x]).unwrap();
    let e = g.add_op(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    let t = g.add_op(Op::Unary(UnaryOp::Tanh), &[e]).unwrap();
    let red = Op::Reduce {
        op: ReduceOp::Sum,
        dim: Some(vec![1]),
        keepdim: false,
    };
    let rs = g.add_op(red, &[t]).unwrap();
    let xt = g.add_op(Op::T, &[x]).unwrap();
    let st = g.add_op(Op::Unary(UnaryOp::Sigmoid), &[xt]).unwrap();
    g.set_outputs(vec![sm, rs, st]);
    let ins = vec![values(&mut rng, DType::F32, &shape, false)];
    let s = check_with(&g, &ins, SOFTMAX_TOL);
    let (a, b, loops) = strips_and_inline(&s, &ins);
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        // sums merge their vector accumulators once per strip: they may round differently
        assert_close(a, b, Tol::ulps(2), &format!("output {i}"));
    }
    assert!(
        tensor_words(&a[2]) == tensor_words(&b[2]),
        "strided sigmoid differs"
    );
    if strips_here {
        assert!(loops >= 2, "softmax and the row sum strip\n{s}");
    }
    // row sums and means of f32 memory: the sum helper reads the input in place
    for op in [ReduceOp::Sum, ReduceOp::Mean] {
        for shape in [&[3usize, 1100][..], &[5, 9], &[2, 0]] {
            let red = Op::Reduce {
                op,
                dim: Some(vec![1]),
                keepdim: false,
            };
            let g = reduce_graph(red, DType::F32, shape);
            let ins = vec![values(&mut rng, DType::F32, shape, true)];
            let s = check_with(&g, &ins, reduction_tol(DType::F32));
            let (a, b, loops) = strips_and_inline(&s, &ins);
            assert_close(&a[0], &b[0], Tol::ulps(1), "strip sum");
            // rows shorter than 64 stay inline: a helper call per row costs more
            if strips_here && shape[1] >= 64 {
                assert!(loops > 0, "{shape:?}: the sum takes no strip\n{s}");
            } else {
                assert_eq!(loops, 0, "{shape:?}: a short row takes a strip\n{s}");
            }
        }
    }
    // 40 tanh in a row: 16 get strip rows (32 KiB of stack), the rest stay inline
    let mut g = Graph::new("strip_chain");
    let x = input(&mut g, "x", DType::F32, &[2, 700]);
    let mut y = x;
    for _ in 0..40 {
        y = g.add_op(Op::Unary(UnaryOp::Tanh), &[y]).unwrap();
    }
    g.set_outputs(vec![y]);
    let ins = vec![values(&mut rng, DType::F32, &[2, 700], false)];
    let s = check_with(&g, &ins, Tol::ulps(64));
    let (a, b, loops) = strips_and_inline(&s, &ins);
    assert!(
        tensor_words(&a[0]) == tensor_words(&b[0]),
        "tanh chain differs"
    );
    assert_eq!(loops, usize::from(strips_here));
}

/// An output written over its own input (`call_into`) in strips: each element is read before
/// it is overwritten, also when a second transcendental reads the same input.
#[test]
fn strips_write_safely_over_their_input() {
    let mut rng = StdRng::seed_from_u64(13);
    let shape = [3usize, 1030];
    for two in [false, true] {
        let mut g = Graph::new("strip_in_place");
        let x = input(&mut g, "x", DType::F32, &shape);
        let e = g.add_op(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
        let mut outs = vec![e];
        if two {
            outs.push(g.add_op(Op::Unary(UnaryOp::Tanh), &[x]).unwrap());
        }
        g.set_outputs(outs.clone());
        let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
        let xv = values(&mut rng, DType::F32, &shape, false);
        let want = f.call(std::slice::from_ref(&xv)).unwrap();
        let data: Vec<f32> = xv.to_f64_vec().iter().map(|&v| v as f32).collect();
        let dst = Tensor::from_vec(data, &shape).unwrap();
        let into: Vec<Option<&Tensor>> =
            (0..outs.len()).map(|i| (i == 0).then_some(&dst)).collect();
        let got = f.call_into(std::slice::from_ref(&dst), &into).unwrap();
        assert!(got[0].shares_storage(&dst), "two = {two}: written in place");
        for (a, b) in got.iter().zip(&want) {
            assert!(
                tensor_words(a) == tensor_words(b),
                "two = {two}: outputs differ"
            );
        }
    }
}

/// Stores into large contiguous f32 outputs go through stack rows and non-temporal stores
/// (`codegen_cpu::streamed_stores`): the same bits as plain stores, in element-wise and row kernels,
/// with tails, single elements and empty outputs, in 1 and 3 chunks.
#[test]
fn large_outputs_stream_with_the_plain_results() {
    let streams_here = smelt::codegen_cpu::vmath::available();
    let with = |min| CodegenOptions {
        stream_min_bytes: Some(min),
        ..CodegenOptions::default()
    };
    let (stream, plain) = (with(0), with(usize::MAX));
    let mut rng = StdRng::seed_from_u64(14);
    for shape in [
        &[7usize][..],
        &[3, 1030],
        &[2, 1, 1543],
        &[1],
        &[0],
        &[4, 0],
    ] {
        let mut g = Graph::new("stream");
        let x = input(&mut g, "x", DType::F32, shape);
        let r = g.add_op(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
        let half = g.add_scalar(Scalar::Float(0.5)).unwrap();
        let h = g.add_op(Op::Binary(BinaryOp::Mul), &[r, half]).unwrap();
        let sm = g.add_op(Op::Softmax { dim: -1 }, &[x]).unwrap();
        g.set_outputs(vec![h, sm]);
        let ins = vec![values(&mut rng, DType::F32, shape, true)];
        let s = check_with(&g, &ins, SOFTMAX_TOL);
        for chunks in [1, 3] {
            let a = run_compiled(&s, &ins, chunks, &stream).unwrap();
            let b = run_compiled(&s, &ins, chunks, &plain).unwrap();
            for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                assert!(
                    tensor_words(a) == tensor_words(b),
                    "{shape:?} output {i}, {chunks} chunks: streamed and plain stores differ"
                );
            }
        }
        let (mut on, mut off) = (0, 0);
        for step in &s.steps {
            if let Step::Kernel(k) = step {
                on += compile_kernel(k, &s.buffers, &stream)
                    .unwrap()
                    .stream_loops();
                off += compile_kernel(k, &s.buffers, &plain)
                    .unwrap()
                    .stream_loops();
            }
        }
        assert_eq!(off, 0, "{shape:?}: below the threshold nothing streams");
        if streams_here && shape.iter().product::<usize>() > 1 {
            assert!(on >= 1, "{shape:?}: the outputs stream\n{s}");
        }
    }
}

/// With the default threshold, an 8 MiB output streams; written over its own input
/// (`call_into`), each strip is read before it is overwritten.
#[test]
fn a_streamed_output_may_overwrite_its_input() {
    let shape = [2048usize, 1031];
    let mut g = Graph::new("stream_in_place");
    let x = input(&mut g, "x", DType::F32, &shape);
    let r = g.add_op(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    let half = g.add_scalar(Scalar::Float(0.5)).unwrap();
    let y = g.add_op(Op::Binary(BinaryOp::Mul), &[r, half]).unwrap();
    g.set_outputs(vec![y]);
    let s = compile(&g).unwrap();
    let Step::Kernel(k) = &s.steps[0] else {
        panic!("one kernel expected")
    };
    let ck = compile_kernel(k, &s.buffers, &CodegenOptions::default()).unwrap();
    let big = shape.iter().product::<usize>() * 4 >= smelt::codegen_cpu::STREAM_MIN_BYTES;
    assert!(big, "the test output reaches the threshold");
    if smelt::codegen_cpu::vmath::available() {
        assert_eq!(ck.stream_loops(), 1);
    }
    let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
    let mut rng = StdRng::seed_from_u64(15);
    let xv = values(&mut rng, DType::F32, &shape, true);
    let want = smelt::kernel::interp::run(&s, std::slice::from_ref(&xv)).unwrap()[0].to_f64_vec();
    let data: Vec<f32> = xv.to_f64_vec().iter().map(|&v| v as f32).collect();
    let dst = Tensor::from_vec(data, &shape).unwrap();
    let got = f
        .call_into(std::slice::from_ref(&dst), &[Some(&dst)])
        .unwrap();
    assert!(got[0].shares_storage(&dst), "written in place");
    for (i, (a, b)) in got[0].to_f64_vec().iter().zip(&want).enumerate() {
        assert!(
            a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
            "element {i}: got {a}, expected {b}"
        );
    }
}

// ---- random graphs (the generator of tests/common) -----------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn random_graphs_match_the_interpreter(seed in any::<u64>(), n in 1usize..14) {
        let g = random_graph(seed, n);
        let mut rng = StdRng::seed_from_u64(seed);
        let ins: Vec<Tensor> = g
            .inputs()
            .iter()
            .map(|&v| {
                let ty = &g.node(v).ty;
                values(&mut rng, ty.dtype, &ty.shape, false)
            })
            .collect();
        // exp/tanh chains: a few ulps per op, amplified by sums
        check_with(&g, &ins, Tol::rel(1e-4).or_ulps(64));
    }
}

#[test]
fn softmax_keeps_its_exponentials_in_a_row_cache() {
    let mut rng = StdRng::seed_from_u64(11);
    // rows of 8193 f32 (32.8 KB) are over the cache's budget and recompute instead
    for (d, shape, cached) in [
        (DType::F32, &[6usize, 7][..], 1),
        (DType::F32, &[3, 1], 0),
        (DType::F32, &[2, 4097], 1),
        (DType::F32, &[2, 8193], 0),
        (DType::F64, &[5, 37], 1),
        (DType::F16, &[4, 33], 1),
    ] {
        let mut g = Graph::new("softmax_and_exp");
        let x = input(&mut g, "x", d, shape);
        // scaled, as in attention: a plain f32 softmax is one row-helper call per row
        let half = g.add_scalar(Scalar::Float(0.5)).unwrap();
        let xs = g.add_op(Op::Binary(BinaryOp::Mul), &[x, half]).unwrap();
        let y = g.add_op(Op::Softmax { dim: -1 }, &[xs]).unwrap();
        g.set_outputs(vec![y]);
        // NaN, infinities and huge values in the first row
        let ins = vec![values(&mut rng, d, shape, true)];
        let s = check_with(&g, &ins, reduction_tol(d));
        let Some(Step::Kernel(k)) = s.steps.first() else {
            panic!("{d:?} {shape:?}: one kernel expected\n{s}")
        };
        let ck = compile_kernel(k, &s.buffers, &CodegenOptions::default()).unwrap();
        assert_eq!(ck.cached_rows(), cached, "{d:?} {shape:?}");
    }
    // layer_norm has no costly value to share: nothing is cached
    let mut g = Graph::new("layer_norm");
    let x = input(&mut g, "x", DType::F32, &[4, 64]);
    let op = Op::LayerNorm {
        normalized_shape: vec![64],
        eps: 1e-5,
        has_weight: false,
        has_bias: false,
    };
    let y = g.add_op(op, &[x]).unwrap();
    g.set_outputs(vec![y]);
    let ins = vec![values(&mut rng, DType::F32, &[4, 64], false)];
    let s = check_with(&g, &ins, Tol::rel(1e-6).or_ulps(8));
    let Step::Kernel(k) = &s.steps[0] else {
        panic!("one kernel expected")
    };
    let ck = compile_kernel(k, &s.buffers, &CodegenOptions::default()).unwrap();
    assert_eq!(ck.cached_rows(), 0);
}

#[test]
fn vector_max_and_min_propagate_nan_from_any_lane() {
    // row r holds NaN at position r (every lane of both vector groups and the tail), the
    // last row none; infinities elsewhere must not mask it
    let (rows, n) = (20usize, 19usize);
    let mut v = vec![0f32; rows * n];
    for r in 0..rows {
        for c in 0..n {
            v[r * n + c] = ((r * 7 + c * 3) % 11) as f32 - 5.0;
        }
        v[r * n + (r + 1) % n] = f32::INFINITY;
        v[r * n + (r + 2) % n] = f32::NEG_INFINITY;
        if r < n {
            v[r * n + r] = f32::NAN;
        }
    }
    let x = Tensor::from_vec(v, &[rows, n]).unwrap();
    for op in [ReduceOp::Amax, ReduceOp::Amin] {
        let o = Op::Reduce {
            op,
            dim: Some(vec![1]),
            keepdim: false,
        };
        let g = reduce_graph(o, DType::F32, &[rows, n]);
        let s = check_with(&g, std::slice::from_ref(&x), Tol::EXACT);
        let got = run_compiled(&s, std::slice::from_ref(&x), 1, &CodegenOptions::default())
            .unwrap()
            .remove(0)
            .to_f64_vec();
        for (r, g) in got.iter().enumerate() {
            // PyTorch: amax/amin of a row holding NaN is NaN; else ±inf
            let want = if r < n {
                f64::NAN
            } else if op == ReduceOp::Amax {
                f64::INFINITY
            } else {
                f64::NEG_INFINITY
            };
            assert!(
                (g.is_nan() && want.is_nan()) || *g == want,
                "{op:?} row {r}: {g}"
            );
        }
    }
}

/// The rows each kernel of `s` runs side by side as lanes (0: none).
fn lane_rows(s: &Schedule) -> Vec<usize> {
    s.kernels()
        .map(|k| {
            compile_kernel(k, &s.buffers, &CodegenOptions::default())
                .unwrap()
                .lane_rows()
        })
        .collect()
}

#[test]
fn reductions_across_rows_run_rows_as_lanes() {
    let mut rng = StdRng::seed_from_u64(12);
    let red = |op, dim: Vec<i64>, keepdim| Op::Reduce {
        op,
        dim: Some(dim),
        keepdim,
    };
    // (shape, reduced dims): the last kept dim must be contiguous and at least one block wide
    for (shape, dims) in [
        (&[9usize, 16][..], vec![0i64]),
        (&[5, 37], vec![0]),
        (&[3, 7, 33], vec![1]),
        (&[2, 130, 17], vec![1]),
        (&[3, 4097], vec![0]),
        (&[64, 3, 20], vec![0, 1]),
    ] {
        let mut ops = vec![
            red(ReduceOp::Sum, dims.clone(), false),
            red(ReduceOp::Mean, dims.clone(), true),
            red(ReduceOp::Amax, dims.clone(), false),
            red(ReduceOp::Amin, dims.clone(), true),
        ];
        if dims.len() == 1 {
            ops.push(Op::Softmax { dim: dims[0] });
            ops.push(Op::Var {
                dim: Some(dims.clone()),
                correction: 1.0,
                keepdim: true,
            });
        }
        for op in ops {
            let g = reduce_graph(op.clone(), DType::F32, shape);
            // specials (NaN, infinities, huge values) at the start of the input
            let ins = vec![values(&mut rng, DType::F32, shape, true)];
            let s = check_with(&g, &ins, Tol::rel(1e-6).or_ulps(8));
            let lanes = lane_rows(&s);
            assert!(
                lanes.contains(&16),
                "{} over {dims:?} of {shape:?}: kernels' lane rows {lanes:?}\n{s}",
                op.name()
            );
        }
    }
    // sums of rows as lanes are the same f64 sums in the same order as one row at a time
    let x = values(&mut rng, DType::F32, &[300, 48], false);
    let g = reduce_graph(red(ReduceOp::Sum, vec![0], false), DType::F32, &[300, 48]);
    check_with(&g, std::slice::from_ref(&x), Tol::EXACT);
    let t = x.transpose(0, 1).unwrap().contiguous().unwrap();
    let g = reduce_graph(red(ReduceOp::Sum, vec![1], false), DType::F32, &[48, 300]);
    let s = compile(&g).unwrap();
    let by_rows = run_compiled(&s, &[t], 1, &CodegenOptions::default()).unwrap();
    let s = compile(&reduce_graph(
        red(ReduceOp::Sum, vec![0], false),
        DType::F32,
        &[300, 48],
    ))
    .unwrap();
    let by_lanes = run_compiled(&s, &[x], 1, &CodegenOptions::default()).unwrap();
    assert_close(&by_lanes[0], &by_rows[0], Tol::EXACT, "lanes against rows");
}

/// A layer norm's weight gradient, `sum(g · (x + pos - mean) · rstd)` over batch and
/// tokens, where the position embedding repeats across the batch: the reduced space does not
/// coalesce into one dim, and the rows still run as lanes, over two nested loops in the
/// rows' order (the same bits in 1 and 3 chunks and against the interpreter's tolerance).
#[test]
fn rows_as_lanes_walk_a_reduced_space_of_two_dims() {
    let mut rng = StdRng::seed_from_u64(17);
    for [b, t, c] in [[3usize, 5, 96], [2, 7, 40], [4, 1, 16], [1, 3, 33]] {
        let mut g = Graph::new("ln_weight_grad");
        let gr = input(&mut g, "g", DType::F32, &[b, t, c]);
        let x = input(&mut g, "x", DType::F32, &[b, t, c]);
        let pos = input(&mut g, "pos", DType::F32, &[t, c]);
        let mean = input(&mut g, "mean", DType::F32, &[b, t, 1]);
        let var = input(&mut g, "var", DType::F32, &[b, t, 1]);
        let add = |g: &mut Graph, p, q| g.add_op(Op::Binary(BinaryOp::Add), &[p, q]).unwrap();
        let xp = add(&mut g, x, pos);
        let d = g.add_op(Op::Binary(BinaryOp::Sub), &[xp, mean]).unwrap();
        let eps = g.add_scalar(Scalar::Float(1e-5)).unwrap();
        let ve = add(&mut g, var, eps);
        let r = g.add_op(Op::Unary(UnaryOp::Rsqrt), &[ve]).unwrap();
        let xh = g.add_op(Op::Binary(BinaryOp::Mul), &[d, r]).unwrap();
        let p = g.add_op(Op::Binary(BinaryOp::Mul), &[gr, xh]).unwrap();
        let red = |dim: Vec<i64>| Op::Reduce {
            op: ReduceOp::Sum,
            dim: Some(dim),
            keepdim: false,
        };
        let w = g.add_op(red(vec![0, 1]), &[p]).unwrap();
        let bias = g.add_op(red(vec![0, 1]), &[gr]).unwrap();
        g.set_outputs(vec![w, bias]);
        let mut ins: Vec<Tensor> = [&[b, t, c][..], &[b, t, c], &[t, c], &[b, t, 1]]
            .iter()
            .map(|sh| values(&mut rng, DType::F32, sh, false))
            .collect();
        let v = values(&mut rng, DType::F32, &[b, t, 1], false);
        ins.push(v.abs().unwrap());
        let s = check_with(&g, &ins, Tol::rel(1e-5).or_ulps(8));
        let lanes = lane_rows(&s);
        assert!(lanes.contains(&16), "{b}x{t}x{c}: lane rows {lanes:?}\n{s}");
        let one = run_compiled(&s, &ins, 1, &CodegenOptions::default()).unwrap();
        let three = run_compiled(&s, &ins, 3, &CodegenOptions::default()).unwrap();
        for (x, y) in one.iter().zip(&three) {
            assert!(
                tensor_words(x) == tensor_words(y),
                "{b}x{t}x{c}: chunks differ"
            );
        }
    }
}

/// The column sums of every kernel of `s` (reductions summed by the native helper).
fn column_sums(s: &Schedule) -> usize {
    s.steps
        .iter()
        .map(|st| match st {
            Step::Kernel(k) => compile_kernel(k, &s.buffers, &CodegenOptions::default())
                .unwrap()
                .column_sums(),
            Step::Extern(_) | Step::Control(_) => 0,
        })
        .sum()
}

/// Sums and means over rows as lanes take the column-sum helper: blocks cut short by a
/// chunk or by the dim, tiles of rows, no rows at all, two sums in one kernel, an epilogue
/// after the sum. The results match the interpreter bit for bit, and a plain sum is the
/// f64 sum of each column in row order rounded once.
#[test]
fn column_sums_add_each_column_in_row_order() {
    let mut rng = StdRng::seed_from_u64(31);
    let red = |op, keepdim| Op::Reduce {
        op,
        dim: Some(vec![0]),
        keepdim,
    };
    for shape in [
        [5usize, 37],
        [3, 4097],
        [300, 48],
        [1000, 531],
        [0, 40],
        [2000, 33],
    ] {
        let x = values(&mut rng, DType::F32, &shape, false);
        for op in [red(ReduceOp::Sum, false), red(ReduceOp::Mean, true)] {
            let g = reduce_graph(op.clone(), DType::F32, &shape);
            let s = check_with(&g, std::slice::from_ref(&x), Tol::EXACT);
            assert!(column_sums(&s) > 0, "{} of {shape:?}:\n{s}", op.name());
        }
        if shape[0] >= 1024 {
            continue; // tiled: partial sums of row tiles, then their sum
        }
        let g = reduce_graph(red(ReduceOp::Sum, false), DType::F32, &shape);
        let got = run_compiled(
            &compile(&g).unwrap(),
            std::slice::from_ref(&x),
            3,
            &Default::default(),
        )
        .unwrap();
        let xs = x.to_f64_vec();
        let want: Vec<f64> = (0..shape[1])
            .map(|c| (0..shape[0]).fold(0.0, |s, r| s + xs[r * shape[1] + c]) as f32 as f64)
            .collect();
        assert_eq!(got[0].to_f64_vec(), want, "sum over dim 0 of {shape:?}");
    }
    // two sums in one kernel and an epilogue: mean(a, 0) * 2 + sum(b, 0)
    let shape = [70usize, 100];
    let mut g = Graph::new("two column sums");
    let a = input(&mut g, "a", DType::F32, &shape);
    let b = input(&mut g, "b", DType::F32, &shape);
    let ma = g.add_op(red(ReduceOp::Mean, false), &[a]).unwrap();
    let two = g.add_scalar(Scalar::Float(2.0)).unwrap();
    let ma2 = g.add_op(Op::Binary(BinaryOp::Mul), &[ma, two]).unwrap();
    let sb = g.add_op(red(ReduceOp::Sum, false), &[b]).unwrap();
    let y = g.add_op(Op::Binary(BinaryOp::Add), &[ma2, sb]).unwrap();
    g.set_outputs(vec![y]);
    let ins = [0, 1].map(|_| values(&mut rng, DType::F32, &shape, true));
    let s = check_with(&g, &ins, Tol::EXACT);
    assert_eq!(column_sums(&s), 2, "{s}");
}

/// softmax and log_softmax of contiguous f32 rows (of at least 64) run as one row-helper
/// call per row; against float64 softmax, with NaN, ±inf and whole rows of -inf among the
/// inputs, and in 1 and 3 chunks of rows against the interpreter. A softmax of a transposed
/// view or of a computed input keeps the generic lowering, with the same results.
#[test]
fn softmax_rows_call_the_row_helper() {
    let mut rng = StdRng::seed_from_u64(31);
    let helpers = smelt::codegen_cpu::vmath::available();
    for (shape, log, transpose, scaled) in [
        ([6usize, 64], false, false, false),
        ([5, 1031], false, false, false),
        ([7, 4097], true, false, false),
        ([1, 300], true, false, false),
        ([5, 63], false, false, false),
        ([200, 100], false, true, false),
        ([6, 200], true, false, true),
    ] {
        let (rows, n) = (shape[0], shape[1]);
        let mut g = Graph::new("softmax_rows");
        let x = input(&mut g, "x", DType::F32, &shape);
        let mut a = x;
        if transpose {
            a = g.add_op(Op::Transpose { dim0: 0, dim1: 1 }, &[a]).unwrap();
        }
        if scaled {
            let two = g.add_scalar(Scalar::Float(2.0)).unwrap();
            a = g.add_op(Op::Binary(BinaryOp::Mul), &[a, two]).unwrap();
        }
        let op = if log {
            Op::LogSoftmax { dim: -1 }
        } else {
            Op::Softmax { dim: -1 }
        };
        let y = g.add_op(op, &[a]).unwrap();
        g.set_outputs(vec![y]);
        let mut data: Vec<f32> = (0..rows * n)
            .map(|_| rng.random_range(-30.0f32..30.0))
            .collect();
        data[3] = f32::NAN;
        if rows > 2 {
            data[n..2 * n].fill(f32::NEG_INFINITY);
            data[2 * n + 5] = f32::INFINITY;
        }
        data[(rows - 1) * n + 1] = f32::NEG_INFINITY;
        let xv = Tensor::from_vec(data.clone(), &shape).unwrap();
        let s = check_with(&g, std::slice::from_ref(&xv), SOFTMAX_TOL);
        // float64 softmax of the rows the op sees
        let (rs, cs) = if transpose { (n, rows) } else { (rows, n) };
        let at = |r: usize, c: usize| {
            let v = if transpose {
                data[c * n + r]
            } else {
                data[r * n + c]
            };
            f64::from(v) * if scaled { 2.0 } else { 1.0 }
        };
        let mut want = Vec::new();
        for r in 0..rs {
            let row: Vec<f64> = (0..cs).map(|c| at(r, c)).collect();
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| {
                if v.is_nan() || m.is_nan() {
                    f64::NAN
                } else {
                    m.max(v)
                }
            });
            let sum: f64 = row.iter().map(|&v| (v - m).exp()).sum();
            want.extend(row.iter().map(|&v| {
                if log {
                    v - m - sum.ln()
                } else {
                    (v - m).exp() / sum
                }
            }));
        }
        let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
        let got = f.call(std::slice::from_ref(&xv)).unwrap();
        assert_close(
            &got[0],
            &want[..],
            Tol::allclose(1e-6, 1e-6).or_ulps(8),
            &format!("{shape:?} log {log} transposed {transpose} scaled {scaled}"),
        );
        let mut calls = 0;
        for step in &s.steps {
            if let Step::Kernel(k) = step {
                let ck = compile_kernel(k, &s.buffers, &CodegenOptions::default()).unwrap();
                calls += usize::from(ck.softmax_rows());
            }
        }
        let expect = helpers && !transpose && !scaled && n >= 64;
        assert_eq!(calls, usize::from(expect), "{shape:?} log {log}\n{s}");
    }
}
