//! The one random-graph generator of the differential tests: the fuser, the CPU code
//! generator, compiled functions, the graph passes, the rewriter and the memory planner all
//! draw their graphs from [`random_graph_from`], each with its own [`Recipe`] (the ops it
//! picks from and the shapes it starts with), so that each keeps the graphs it was written
//! for (the same graph for the same seed, which the proptest regression files rely on).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smelt::ir::graph::{Graph, ValueId};
use smelt::ir::op::{BinaryOp, Op, ReduceOp, TensorType, UnaryOp};
use smelt::{DType, Scalar};

fn input(g: &mut Graph, name: &str, dtype: DType, shape: &[usize]) -> ValueId {
    g.add_input(name, TensorType::new(dtype, shape.to_vec()))
        .unwrap()
}

fn op(g: &mut Graph, o: Op, xs: &[ValueId]) -> ValueId {
    g.add_op(o, xs).unwrap()
}

fn num(g: &mut Graph, v: f64) -> ValueId {
    g.add_scalar(Scalar::Float(v)).unwrap()
}

/// One op a generator step adds, with its operands.
pub type Made = Option<(Op, Vec<ValueId>)>;

/// What a random graph is made of.
pub struct Recipe {
    /// The sizes the input dimensions are drawn from.
    pub dims: [usize; 3],
    /// `true`: two sizes `a` and `b`, inputs `x[a,b]`, `y[b]`, `z[a,1]` and the transpose of
    /// `xt[b,a]`; `false`: one size `n`, inputs `x[n,n]` and `y[n]`.
    pub broadcast_inputs: bool,
    /// The dtype of every input.
    pub dtype: fn(&mut StdRng) -> DType,
    /// Values added to the pool after the inputs (given `a`, `b` and the dtype).
    pub leaves: fn(&mut Graph, &mut Vec<ValueId>, usize, usize, DType),
    /// One step: the op to add on `x` and `y` (drawn from the pool), if any.
    pub step: fn(&mut StdRng, &mut Graph, &[ValueId], ValueId, ValueId) -> Made,
    /// Whether a new value may be used by later steps.
    pub keep: fn(&TensorType) -> bool,
    /// The first index of the pool that extra outputs are drawn from.
    pub outs_from: usize,
    /// Whether the finished graph must verify.
    pub verify: bool,
}

/// Builds a random graph of `n_ops` steps of `recipe` from `seed`.
pub fn random_graph_from(recipe: &Recipe, seed: u64, n_ops: usize) -> Graph {
    let mut rng = StdRng::seed_from_u64(seed);
    let dims = recipe.dims;
    let (a, b) = if recipe.broadcast_inputs {
        (dims[rng.random_range(0..3)], dims[rng.random_range(0..3)])
    } else {
        let n = dims[rng.random_range(0..3)];
        (n, n)
    };
    let dtype = (recipe.dtype)(&mut rng);
    let mut g = Graph::new("random");
    let mut pool = vec![
        input(&mut g, "x", dtype, &[a, b]),
        input(&mut g, "y", dtype, &[b]),
    ];
    if recipe.broadcast_inputs {
        pool.push(input(&mut g, "z", dtype, &[a, 1]));
        let xt = input(&mut g, "xt", dtype, &[b, a]);
        pool.push(op(&mut g, Op::T, &[xt]));
    }
    (recipe.leaves)(&mut g, &mut pool, a, b, dtype);
    for _ in 0..n_ops {
        let pick = |rng: &mut StdRng, pool: &[ValueId]| pool[rng.random_range(0..pool.len())];
        let x = pick(&mut rng, &pool);
        let y = pick(&mut rng, &pool);
        if let Some((o, xs)) = (recipe.step)(&mut rng, &mut g, &pool, x, y)
            && let Ok(v) = g.add_op(o, &xs)
            && (recipe.keep)(&g.node(v).ty)
        {
            pool.push(v);
        }
    }
    let n = pool.len();
    let from = recipe.outs_from;
    let mut outs = vec![pool[n - 1]];
    for _ in 0..rng.random_range(0..3) {
        outs.push(pool[rng.random_range(from..n.max(from + 1)).min(n - 1)]);
    }
    g.set_outputs(outs);
    if recipe.verify {
        g.verify().unwrap();
    }
    g
}

/// A random graph of [`Recipe::FUSER`].
pub fn random_graph(seed: u64, n_ops: usize) -> Graph {
    random_graph_from(&Recipe::FUSER, seed, n_ops)
}

fn no_leaves(_: &mut Graph, _: &mut Vec<ValueId>, _: usize, _: usize, _: DType) {}

impl Recipe {
    /// Pointwise, broadcast, view, reduction and matmul ops over `[a, b]` (f32 or f64): what
    /// the fuser, the CPU code generator and compiled functions are checked on.
    pub const FUSER: Recipe = Recipe {
        dims: [1, 3, 7],
        broadcast_inputs: true,
        dtype: |rng| {
            if rng.random_bool(0.8) {
                DType::F32
            } else {
                DType::F64
            }
        },
        leaves: no_leaves,
        step: fuser_step,
        keep: |t| t.ndim() <= 3,
        outs_from: 4,
        verify: false,
    };

    /// [`Recipe::FUSER`]'s ops at real sizes: odd ones past a vector's width (17), the
    /// compiled code's threading threshold and the GEMM's panels (257, every side of a
    /// product at least 256 when both dims are), at most 2^18 elements a value.
    pub const LARGE: Recipe = Recipe {
        dims: [17, 64, 257],
        keep: |t| t.ndim() <= 3 && t.numel() <= 1 << 18,
        ..Recipe::FUSER
    };

    /// The ops of [`Recipe::FUSER`] and more for the graph passes: leaves that need no input
    /// (`full`, `arange`, constants) as folding material, composites (softmax, log_softmax,
    /// logsumexp, layer_norm, gelu, silu, var, std), expands, and an op repeated on the same
    /// operands (a common subexpression).
    pub const PASSES: Recipe = Recipe {
        leaves: passes_leaves,
        step: passes_step,
        ..Recipe::FUSER
    };

    /// Pointwise ops with Python-scalar constants (signed zeros among them) and relu·c chains,
    /// views, squeezes, strided slices, casts, broadcasts, reductions and matmuls over `[a, b]`
    /// (f32, f64 or f16), at most 4096 elements a value: what the rewriter is checked on.
    pub const REWRITE: Recipe = Recipe {
        dims: [1, 3, 5],
        dtype: |rng| [DType::F32, DType::F64, DType::F16][rng.random_range(0..3)],
        step: rewrite_step,
        keep: |t| t.ndim() <= 3 && t.numel() <= 4096,
        verify: true,
        ..Recipe::FUSER
    };

    /// Pointwise, reduction, view, matmul and softmax ops over square `[n, n]` inputs with
    /// several outputs: what the memory planner is checked on.
    pub const MEMPLAN: Recipe = Recipe {
        dims: [1, 3, 7],
        broadcast_inputs: false,
        dtype: |rng| {
            if rng.random_bool(0.7) {
                DType::F32
            } else {
                DType::F64
            }
        },
        leaves: no_leaves,
        step: memplan_step,
        keep: |t| t.ndim() <= 2,
        outs_from: 0,
        verify: false,
    };
}

fn fuser_step(rng: &mut StdRng, g: &mut Graph, _: &[ValueId], x: ValueId, y: ValueId) -> Made {
    let nd = g.node(x).ty.ndim() as i64;
    Some(match rng.random_range(0..11) {
        0 => (Op::Unary(UnaryOp::Relu), vec![x]),
        1 => (Op::Unary(UnaryOp::Exp), vec![x]),
        2 => (Op::Unary(UnaryOp::Tanh), vec![x]),
        3 | 4 => {
            let ops = [
                BinaryOp::Add,
                BinaryOp::Sub,
                BinaryOp::Mul,
                BinaryOp::Maximum,
            ];
            (Op::Binary(ops[rng.random_range(0..4)]), vec![x, y])
        }
        5 => {
            let s = num(g, rng.random_range(-2.0..2.0));
            (Op::Binary(BinaryOp::Mul), vec![x, s])
        }
        6 if nd > 0 => {
            let ops = [ReduceOp::Sum, ReduceOp::Amax, ReduceOp::Mean];
            let dim = Some(vec![rng.random_range(-nd..nd)]);
            let keepdim = rng.random_bool(0.7);
            (
                Op::Reduce {
                    op: ops[rng.random_range(0..3)],
                    dim,
                    keepdim,
                },
                vec![x],
            )
        }
        7 if nd == 2 => (Op::T, vec![x]),
        8 => (Op::Unsqueeze { dim: 0 }, vec![x]),
        9 if nd > 0 && g.node(x).ty.shape[0] > 1 => (
            Op::Narrow {
                dim: 0,
                start: 1,
                length: g.node(x).ty.shape[0] as i64 - 1,
            },
            vec![x],
        ),
        10 if nd == 2
            && g.node(y).ty.ndim() == 2
            && g.node(x).ty.shape[1] == g.node(y).ty.shape[0] =>
        {
            (Op::Matmul, vec![x, y])
        }
        _ => match g.add_op(Op::Binary(BinaryOp::Gt), &[x, y]) {
            Ok(c) => (Op::Where, vec![c, x, y]),
            Err(_) => (Op::Unary(UnaryOp::Neg), vec![x]),
        },
    })
}

/// Input-free values: an arange cast to the dtype and a full added to it.
fn passes_leaves(g: &mut Graph, pool: &mut Vec<ValueId>, a: usize, b: usize, dtype: DType) {
    let arange = Op::Arange {
        start: Scalar::Int(0),
        end: Scalar::Int(b as i64),
        step: Scalar::Int(1),
        dtype: None,
    };
    let ar = op(g, arange, &[]);
    let ar = op(g, Op::To { dtype }, &[ar]);
    pool.push(ar);
    let full = Op::Full {
        size: vec![a, 1],
        fill_value: Scalar::Float(0.25),
        dtype: Some(dtype),
    };
    let f = op(g, full, &[]);
    pool.push(op(g, Op::Binary(BinaryOp::Add), &[f, ar]));
}

fn passes_step(rng: &mut StdRng, g: &mut Graph, pool: &[ValueId], x: ValueId, y: ValueId) -> Made {
    let ty = g.node(x).ty.clone();
    let nd = ty.ndim() as i64;
    Some(match rng.random_range(0..16) {
        0 => (Op::Unary(UnaryOp::Relu), vec![x]),
        1 => (Op::Unary(UnaryOp::Exp), vec![x]),
        2 => (Op::Unary(UnaryOp::Tanh), vec![x]),
        3 | 4 => {
            let ops = [
                BinaryOp::Add,
                BinaryOp::Sub,
                BinaryOp::Mul,
                BinaryOp::Maximum,
            ];
            (Op::Binary(ops[rng.random_range(0..4)]), vec![x, y])
        }
        5 => {
            let s = num(g, rng.random_range(-2.0..2.0));
            (Op::Binary(BinaryOp::Mul), vec![x, s])
        }
        6 if nd > 0 => {
            let ops = [ReduceOp::Sum, ReduceOp::Amax, ReduceOp::Mean];
            let dim = Some(vec![rng.random_range(-nd..nd)]);
            let keepdim = rng.random_bool(0.7);
            let r = ops[rng.random_range(0..3)];
            (
                Op::Reduce {
                    op: r,
                    dim,
                    keepdim,
                },
                vec![x],
            )
        }
        7 if nd == 2 => (Op::T, vec![x]),
        8 => (Op::Unsqueeze { dim: 0 }, vec![x]),
        9 if nd > 0 && ty.shape[0] > 1 => (
            Op::Narrow {
                dim: 0,
                start: 1,
                length: ty.shape[0] as i64 - 1,
            },
            vec![x],
        ),
        10 if nd > 0 => {
            let dim = rng.random_range(-nd..nd);
            let o = match rng.random_range(0..3) {
                0 => Op::Softmax { dim },
                1 => Op::LogSoftmax { dim },
                _ => Op::Reduce {
                    op: ReduceOp::LogSumExp,
                    dim: Some(vec![dim]),
                    keepdim: rng.random_bool(0.5),
                },
            };
            (o, vec![x])
        }
        11 if nd > 0 => {
            let last = *ty.shape.last().unwrap_or(&1);
            (
                Op::LayerNorm {
                    normalized_shape: vec![last],
                    eps: 1e-5,
                    has_weight: false,
                    has_bias: false,
                },
                vec![x],
            )
        }
        12 => {
            let u = [
                UnaryOp::Gelu { tanh: false },
                UnaryOp::Gelu { tanh: true },
                UnaryOp::Silu,
            ];
            (Op::Unary(u[rng.random_range(0..3)]), vec![x])
        }
        13 if nd > 0 => {
            let dim = Some(vec![rng.random_range(-nd..nd)]);
            let correction = rng.random_range(0..2) as f64;
            if rng.random_bool(0.5) {
                (
                    Op::Var {
                        dim,
                        correction,
                        keepdim: true,
                    },
                    vec![x],
                )
            } else {
                (
                    Op::Std {
                        dim,
                        correction,
                        keepdim: false,
                    },
                    vec![x],
                )
            }
        }
        14 => {
            // the op just added, again on the same operands: a common subexpression
            let last = *pool.last().unwrap_or(&x);
            match g.node(last).op().cloned() {
                Some(o) if !g.operands(last).is_empty() => (o, g.operands(last)),
                _ => (Op::Unary(UnaryOp::Neg), vec![x]),
            }
        }
        15 if nd >= 1 => {
            let last = ty.shape[ty.shape.len() - 1];
            let mut size: Vec<i64> = vec![2];
            size.extend(ty.shape.iter().map(|&s| s as i64));
            let _ = last;
            (Op::Expand { size }, vec![x])
        }
        _ => match g.add_op(Op::Binary(BinaryOp::Gt), &[x, y]) {
            Ok(c) => (Op::Where, vec![c, x, y]),
            Err(_) => (Op::Unary(UnaryOp::Neg), vec![x]),
        },
    })
}

fn rewrite_step(rng: &mut StdRng, g: &mut Graph, _: &[ValueId], x: ValueId, y: ValueId) -> Made {
    let consts = [0.5, 2.0, 1.0, -0.0, 0.0, -1.5, 0.25];
    let ty = g.node(x).ty.clone();
    let nd = ty.ndim() as i64;
    let c = consts[rng.random_range(0..consts.len())];
    match rng.random_range(0..17) {
        0 => Some((Op::Unary(UnaryOp::Relu), vec![x])),
        1 => Some((Op::Unary(UnaryOp::Exp), vec![x])),
        2 => Some((Op::Unary(UnaryOp::Neg), vec![x])),
        3 | 4 => {
            let ops = [
                BinaryOp::Add,
                BinaryOp::Sub,
                BinaryOp::Mul,
                BinaryOp::Div,
                BinaryOp::Maximum,
            ];
            Some((Op::Binary(ops[rng.random_range(0..5)]), vec![x, y]))
        }
        5 | 6 => {
            let ops = [BinaryOp::Mul, BinaryOp::Add, BinaryOp::Sub, BinaryOp::Div];
            let s = num(g, c);
            Some((Op::Binary(ops[rng.random_range(0..4)]), vec![x, s]))
        }
        7 if nd > 0 => {
            let ops = [ReduceOp::Sum, ReduceOp::Amax, ReduceOp::Mean];
            let dim = Some(vec![rng.random_range(-nd..nd)]);
            let keepdim = rng.random_bool(0.7);
            let op = ops[rng.random_range(0..3)];
            Some((Op::Reduce { op, dim, keepdim }, vec![x]))
        }
        8 if nd == 2 => Some((Op::T, vec![x])),
        9 => Some((Op::Unsqueeze { dim: 0 }, vec![x])),
        10 if nd > 0 => Some((Op::Squeeze { dim: None }, vec![x])),
        11 if nd == 2 => {
            let r = op(g, Op::Unary(UnaryOp::Relu), &[x]);
            let s = num(g, c);
            Some((Op::Binary(BinaryOp::Mul), vec![r, s]))
        }
        12 if nd >= 1 => {
            let yt = &g.node(y).ty;
            (yt.ndim() >= 1 && yt.shape[0] == ty.shape[nd as usize - 1])
                .then(|| (Op::Matmul, vec![x, y]))
        }
        13 if nd == 2 => {
            let t = op(g, Op::T, &[x]);
            Some((Op::Contiguous, vec![t]))
        }
        14 => Some((Op::To { dtype: DType::F64 }, vec![x])),
        15 if nd > 0 => {
            let step = 2;
            let dim = 0;
            Some((
                Op::Slice {
                    dim,
                    start: None,
                    end: None,
                    step,
                },
                vec![x],
            ))
        }
        _ => match g.add_op(Op::Binary(BinaryOp::Gt), &[x, y]) {
            Ok(c) => Some((Op::Where, vec![c, x, y])),
            Err(_) => None,
        },
    }
}

fn memplan_step(rng: &mut StdRng, g: &mut Graph, _: &[ValueId], x: ValueId, y: ValueId) -> Made {
    let nd = g.node(x).ty.ndim() as i64;
    Some(match rng.random_range(0..7) {
        0 => (Op::Unary(UnaryOp::Exp), vec![x]),
        1 => (Op::Binary(BinaryOp::Add), vec![x, y]),
        2 => (Op::Binary(BinaryOp::Mul), vec![x, y]),
        3 if nd > 0 => (
            Op::Reduce {
                op: ReduceOp::Sum,
                dim: Some(vec![nd - 1]),
                keepdim: rng.random_bool(0.5),
            },
            vec![x],
        ),
        4 if nd == 2 => (Op::T, vec![x]),
        5 => (Op::Matmul, vec![x, y]),
        _ => (Op::Softmax { dim: -1 }, vec![x]),
    })
}
