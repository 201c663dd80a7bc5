//! Random graphs for the differential fuzzer.
//!
//! A graph grows one op at a time from a few inputs: each step picks an op of the table
//! (every unary, binary and reduction op by name, then views, indexing, matmul and einsum,
//! convolutions and pooling, normalisations, attention, casts), draws its attributes from
//! the operand's type, and keeps it when the graph accepts it ([`Op::from_call`], then
//! shape inference in [`Graph::add_op`]): the verifier, not a second copy of its rules,
//! decides what is valid. Sizes are drawn small and odd, sometimes 0, and sometimes large
//! (a full vector, the threading thresholds, the GEMM panels).
//!
//! The graph is returned as `.smelt` text. Integer inputs that index another value carry
//! their range in a comment (`# range %i1 0 7`), which [`index_ranges`] reads back, and
//! inputs that are not differentiated (batch norm's running statistics, buffers in PyTorch)
//! are named in another (`# constant %x5`, [`constants`]), so that a case is its text alone.

use crate::ir::attrs::Attr;
use crate::ir::dtype::{DType, Scalar};
use crate::ir::graph::{Graph, Module, ValueId};
use crate::ir::op::{BinaryOp, Op, ReduceOp, TensorType, UnaryOp};
use crate::ir::text::print_module;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};

/// What a graph is built around (its first inputs and the ops it favours).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Pointwise ops, reductions, views and indexing on 0-d to 4-d tensors.
    General,
    /// An NCHW image through convolutions, pooling and batch norm.
    Conv,
    /// Query, key and value through attention, matmuls and softmax.
    Attention,
    /// [`Family::General`] in f16 or bf16.
    Half,
    /// Loops and branches (`fori_loop`, `cond`, nested) around bodies of general ops.
    Control,
}

impl Family {
    /// Every family, in the order a campaign cycles through them.
    pub const ALL: [Family; 5] = [
        Family::General,
        Family::Conv,
        Family::Attention,
        Family::Half,
        Family::Control,
    ];
    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Family::General => "general",
            Family::Conv => "conv",
            Family::Attention => "attention",
            Family::Half => "f16/bf16",
            Family::Control => "control flow",
        }
    }
}

/// A random graph as `.smelt` text, with what it was made of.
#[derive(Clone, Debug)]
pub struct Case {
    /// The module (one graph), index ranges in comments.
    pub text: String,
    /// Its family.
    pub family: Family,
    /// The names of the ops it holds, one per op.
    pub ops: Vec<&'static str>,
}

/// The ranges `[lo, hi)` that integer inputs used as indices must take, from the
/// `# range %name lo hi` comments of a case's text.
pub fn index_ranges(text: &str) -> Vec<(String, i64, i64)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.trim().strip_prefix("# range %")?.split_whitespace();
            let name = w.next()?.to_string();
            let lo = w.next()?.parse().ok()?;
            let hi = w.next()?.parse().ok()?;
            Some((name, lo, hi))
        })
        .collect()
}

/// The inputs a case's text marks `# constant %name`: not differentiated.
pub fn constants(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| Some(l.trim().strip_prefix("# constant %")?.trim().to_string()))
        .collect()
}

/// Most elements a value may have (keeps one graph's run in milliseconds).
const MAX_ELEMS: usize = 1 << 16;

struct Gen {
    rng: StdRng,
    g: Graph,
    /// Values later steps may use (inputs and results).
    pool: Vec<ValueId>,
    dtype: DType,
    ranges: Vec<(String, i64, i64)>,
    constants: Vec<ValueId>,
    ops: Vec<&'static str>,
    /// A body graph: no new inputs (its parameters are fixed by the op that calls it).
    closed: bool,
}

/// Builds the graph of `seed` in `family` with about `n_ops` ops.
pub fn random_case(seed: u64, family: Family, n_ops: usize) -> Case {
    let mut rng = StdRng::seed_from_u64(seed);
    if family == Family::Control {
        return control_case(rng, n_ops);
    }
    let dtype = match family {
        Family::Half => *[DType::F16, DType::BF16]
            .choose(&mut rng)
            .unwrap_or(&DType::F16),
        _ => match rng.random_range(0..10) {
            0..=5 => DType::F32,
            6 | 7 => DType::F64,
            8 => DType::I32,
            _ => DType::I64,
        },
    };
    let mut b = Gen {
        rng,
        g: Graph::new("fuzz"),
        pool: Vec::new(),
        dtype,
        ranges: Vec::new(),
        constants: Vec::new(),
        ops: Vec::new(),
        closed: false,
    };
    b.leaves(family);
    let mut tries = 0;
    while b.ops.len() < n_ops && tries < n_ops * 8 {
        tries += 1;
        b.step(family);
    }
    b.finish(family)
}

impl Gen {
    fn ty(&self, v: ValueId) -> TensorType {
        self.g.node(v).ty.clone()
    }

    fn dim(&mut self) -> usize {
        match self.rng.random_range(0..40) {
            0 => 0,
            1..=24 => *[1, 2, 3, 5, 7, 8].choose(&mut self.rng).unwrap_or(&1),
            25..=35 => *[4, 9, 16, 17, 31, 33].choose(&mut self.rng).unwrap_or(&4),
            _ => *[64, 100, 129, 256, 257]
                .choose(&mut self.rng)
                .unwrap_or(&64),
        }
    }

    /// A shape of `rank` dims with at most [`MAX_ELEMS`] elements.
    fn shape(&mut self, rank: usize) -> Vec<usize> {
        let mut s: Vec<usize> = (0..rank).map(|_| self.dim()).collect();
        while s.iter().product::<usize>() > MAX_ELEMS {
            let i = s
                .iter()
                .enumerate()
                .max_by_key(|(_, d)| **d)
                .map_or(0, |(i, _)| i);
            s[i] = s[i].div_ceil(4);
        }
        s
    }

    fn input(&mut self, dtype: DType, shape: Vec<usize>) -> ValueId {
        let name = format!("x{}", self.g.inputs().len());
        let v = self
            .g
            .add_input(&name, TensorType::new(dtype, shape))
            .expect("fresh input name");
        self.pool.push(v);
        v
    }

    /// An i64 input of `shape` whose values lie in `[0, hi)`.
    fn index_input(&mut self, shape: Vec<usize>, hi: usize) -> ValueId {
        let name = format!("i{}", self.g.inputs().len());
        let v = self
            .g
            .add_input(&name, TensorType::new(DType::I64, shape))
            .expect("fresh input name");
        self.ranges.push((name, 0, hi as i64));
        v
    }

    fn leaves(&mut self, family: Family) {
        let dt = self.dtype;
        match family {
            Family::Conv => {
                let fdt = if dt.is_float() { dt } else { DType::F32 };
                self.dtype = fdt;
                let n = self.rng.random_range(1..3);
                let c = *[1, 3, 4, 8].choose(&mut self.rng).unwrap_or(&3);
                let hw = *[1, 5, 7, 8, 13].choose(&mut self.rng).unwrap_or(&5);
                let w = if self.rng.random_bool(0.5) {
                    hw
                } else {
                    *[1, 6, 9].choose(&mut self.rng).unwrap_or(&6)
                };
                self.input(fdt, vec![n, c, hw, w]);
            }
            Family::Attention => {
                let fdt = if dt.is_float() { dt } else { DType::F32 };
                self.dtype = fdt;
                let b = self.rng.random_range(1..3);
                let h = self.rng.random_range(1..4);
                let l = *[1, 3, 7, 16, 33].choose(&mut self.rng).unwrap_or(&7);
                let s = *[1, 5, 7, 16].choose(&mut self.rng).unwrap_or(&5);
                let e = *[1, 4, 8, 16].choose(&mut self.rng).unwrap_or(&8);
                self.input(fdt, vec![b, h, l, e]);
                self.input(fdt, vec![b, h, s, e]);
                self.input(fdt, vec![b, h, s, e]);
            }
            Family::General | Family::Half | Family::Control => {
                let rank = self.rng.random_range(0..5);
                let s = self.shape(rank);
                self.input(dt, s.clone());
                if self.rng.random_bool(0.6) {
                    // a second input broadcasting against the first
                    let t: Vec<usize> = s
                        .iter()
                        .skip(self.rng.random_range(0..=s.len()))
                        .map(|&d| if self.rng.random_bool(0.3) { 1 } else { d })
                        .collect();
                    self.input(dt, t);
                }
            }
        }
    }

    /// Adds `name(operands, attrs)` when the graph accepts it and its result is small
    /// enough; returns the new value.
    fn try_op(
        &mut self,
        name: &'static str,
        operands: &[ValueId],
        attrs: &[(&str, Attr)],
    ) -> Option<ValueId> {
        let slots = vec![true; operands.len()];
        let op = Op::from_call(name, &slots, attrs).ok()?;
        let types: Vec<TensorType> = operands.iter().map(|&o| self.ty(o)).collect();
        let refs: Vec<&TensorType> = types.iter().collect();
        if op.infer(&refs).ok()?.numel() > MAX_ELEMS {
            return None;
        }
        let v = self.g.add_op(op, operands).ok()?;
        self.ops.push(name);
        self.pool.push(v);
        Some(v)
    }

    fn pick(&mut self) -> ValueId {
        // favour recent values, so that graphs grow deep as well as wide
        let n = self.pool.len();
        let i = if self.rng.random_bool(0.6) {
            n - 1 - self.rng.random_range(0..n.min(3))
        } else {
            self.rng.random_range(0..n)
        };
        self.pool[i]
    }

    fn dim_of(&mut self, rank: usize) -> i64 {
        let d = self.rng.random_range(0..rank.max(1)) as i64;
        // negative dims count from the end, as in PyTorch
        if self.rng.random_bool(0.25) {
            d - rank as i64
        } else {
            d
        }
    }

    fn scalar(&mut self) -> ValueId {
        let s = if self.dtype.is_float() || self.rng.random_bool(0.3) {
            Scalar::Float(
                *[0.5, -1.5, 2.0, 3.25, 1e-3]
                    .choose(&mut self.rng)
                    .unwrap_or(&0.5),
            )
        } else {
            Scalar::Int(self.rng.random_range(-3..4))
        };
        self.g.add_scalar(s).expect("a scalar is always valid")
    }

    /// A second operand for a binary op on `x`: `x` itself, another value, a scalar, or a
    /// new input of a shape broadcasting against `x`.
    fn other(&mut self, x: ValueId) -> ValueId {
        match self.rng.random_range(0..4) {
            0 => x,
            1 => self.pick(),
            2 => self.scalar(),
            _ if self.closed => self.scalar(),
            _ => {
                let s = self.ty(x).shape.clone();
                let t: Vec<usize> = s
                    .iter()
                    .skip(self.rng.random_range(0..=s.len()))
                    .map(|&d| if self.rng.random_bool(0.3) { 1 } else { d })
                    .collect();
                let dt = self.ty(x).dtype;
                self.input(dt, t)
            }
        }
    }

    fn step(&mut self, family: Family) {
        let x = self.pick();
        let tx = self.ty(x);
        let rank = tx.ndim();
        let choice = match family {
            // no contraction or indexing, which bring new inputs
            _ if self.closed => match self.rng.random_range(0..23) {
                c if c >= 20 => c + 3,
                c => c,
            },
            Family::Conv if rank == 4 => self.rng.random_range(0..30),
            Family::Attention if rank >= 3 => self.rng.random_range(0..30),
            _ => self.rng.random_range(0..26),
        };
        match choice {
            0..=5 => {
                let u = *UnaryOp::ALL.choose(&mut self.rng).unwrap_or(&UnaryOp::Neg);
                self.try_op(u.name(), &[x], &[]);
            }
            6..=10 => {
                let b = *BinaryOp::ALL
                    .choose(&mut self.rng)
                    .unwrap_or(&BinaryOp::Add);
                let y = self.other(x);
                let (a, c) = if self.rng.random_bool(0.8) {
                    (x, y)
                } else {
                    (y, x)
                };
                self.try_op(b.name(), &[a, c], &[]);
            }
            11 | 12 => {
                let r = *ReduceOp::ALL
                    .choose(&mut self.rng)
                    .unwrap_or(&ReduceOp::Sum);
                let mut attrs = vec![("keepdim", Attr::Bool(self.rng.random_bool(0.4)))];
                if rank > 0 && self.rng.random_bool(0.8) {
                    let n = if r == ReduceOp::Prod {
                        1
                    } else {
                        self.rng.random_range(1..=rank)
                    };
                    let mut dims: Vec<usize> = (0..rank).collect();
                    dims.sort_by_key(|_| self.rng.random::<u32>());
                    let ds = dims[..n].iter().map(|&d| Attr::Int(d as i64)).collect();
                    attrs.push(("dim", Attr::List(ds)));
                }
                self.try_op(r.name(), &[x], &attrs);
            }
            13 => self.normalise(x, rank),
            14..=17 => self.view(x, &tx),
            18 => self.combine(x, &tx),
            19 => self.select_values(x),
            20 | 21 => self.contract(x, &tx),
            22 => self.index(x, &tx),
            23 => {
                let to = *[
                    DType::F32,
                    DType::F64,
                    DType::F16,
                    DType::BF16,
                    DType::I32,
                    DType::Bool,
                ]
                .choose(&mut self.rng)
                .unwrap_or(&DType::F32);
                self.try_op("to", &[x], &[("dtype", Attr::DType(to))]);
            }
            24 | 25 => {
                let d = self.dim_of(rank);
                let name = *["softmax", "log_softmax", "cumsum"]
                    .choose(&mut self.rng)
                    .unwrap_or(&"softmax");
                self.try_op(name, &[x], &[("dim", Attr::Int(d))]);
            }
            _ => match family {
                Family::Conv => self.image(x, &tx),
                _ => self.attention(x, &tx),
            },
        }
    }

    fn normalise(&mut self, x: ValueId, rank: usize) {
        match self.rng.random_range(0..3) {
            0 if rank > 0 => {
                let k = self.rng.random_range(1..=rank.min(2));
                let shape = self.ty(x).shape[rank - k..].to_vec();
                let list = shape.iter().map(|&d| Attr::Int(d as i64)).collect();
                self.try_op(
                    "layer_norm",
                    &[x],
                    &[("normalized_shape", Attr::List(list))],
                );
            }
            1 if rank > 0 => {
                let d = self.dim_of(rank);
                let name = *["var", "std"].choose(&mut self.rng).unwrap_or(&"var");
                self.try_op(name, &[x], &[("dim", Attr::List(vec![Attr::Int(d)]))]);
            }
            _ => {
                let lo = Attr::Float(-0.5);
                let hi = Attr::Float(*[0.5, 2.0].choose(&mut self.rng).unwrap_or(&0.5));
                self.try_op("clamp", &[x], &[("min", lo), ("max", hi)]);
            }
        }
    }

    fn view(&mut self, x: ValueId, tx: &TensorType) {
        let rank = tx.ndim();
        let s = tx.shape.clone();
        let int = |v: i64| Attr::Int(v);
        let list = |v: Vec<i64>| Attr::List(v.into_iter().map(Attr::Int).collect());
        match self.rng.random_range(0..12) {
            0 => {
                let (a, b) = (self.dim_of(rank), self.dim_of(rank));
                self.try_op("transpose", &[x], &[("dim0", int(a)), ("dim1", int(b))]);
            }
            1 => {
                let mut p: Vec<i64> = (0..rank as i64).collect();
                p.sort_by_key(|_| self.rng.random::<u32>());
                self.try_op("permute", &[x], &[("dims", list(p))]);
            }
            2 if rank > 0 => {
                let d = self.rng.random_range(0..rank);
                let start = self.rng.random_range(0..=s[d]);
                let len = self.rng.random_range(0..=s[d] - start);
                self.try_op(
                    "narrow",
                    &[x],
                    &[
                        ("dim", int(d as i64)),
                        ("start", int(start as i64)),
                        ("length", int(len as i64)),
                    ],
                );
            }
            3 if rank > 0 => {
                let d = self.rng.random_range(0..rank);
                let i = self.rng.random_range(0..s[d].max(1)) as i64;
                self.try_op("select", &[x], &[("dim", int(d as i64)), ("index", int(i))]);
            }
            4 => {
                let d = self.rng.random_range(0..=rank) as i64;
                let u = self.try_op("unsqueeze", &[x], &[("dim", int(d))]);
                if let Some(u) = u {
                    // then broadcast the new dim
                    let mut to: Vec<i64> = self.ty(u).shape.iter().map(|&n| n as i64).collect();
                    to[d as usize] = *[1, 3, 4].choose(&mut self.rng).unwrap_or(&3);
                    self.try_op("expand", &[u], &[("size", list(to))]);
                }
            }
            5 => {
                self.try_op("squeeze", &[x], &[]);
            }
            6 => {
                // a reshape that splits or merges dims
                let n = tx.numel() as i64;
                let shape = match self.rng.random_range(0..3) {
                    0 => vec![-1],
                    1 if n % 2 == 0 && n > 0 => vec![2, -1],
                    _ => vec![n.max(0), 1],
                };
                // not `view` in a body: of a layout it cannot view (an expanded tensor) the
                // compiled paths refuse the graph, as `torch.cond`'s tracing of both
                // branches does, while the oracle runs only the branch taken and so cannot
                // judge it
                let names: &[&str] = match self.closed {
                    true => &["reshape", "flatten"],
                    false => &["reshape", "view", "flatten"],
                };
                let name = *names.choose(&mut self.rng).unwrap_or(&"reshape");
                match name {
                    "flatten" => self.try_op(name, &[x], &[]),
                    _ => self.try_op(name, &[x], &[("shape", list(shape))]),
                };
            }
            7 if rank > 0 => {
                let d = self.dim_of(rank);
                self.try_op("flip", &[x], &[("dims", list(vec![d]))]);
            }
            8 if rank > 0 => {
                let d = self.rng.random_range(0..rank) as i64;
                let step = self.rng.random_range(1..4);
                let start = self.rng.random_range(0..3);
                self.try_op(
                    "slice",
                    &[x],
                    &[("dim", int(d)), ("start", int(start)), ("step", int(step))],
                );
            }
            9 if rank >= 2 => {
                let off = self.rng.random_range(-2..3);
                let name = *["diagonal", "tril", "triu"]
                    .choose(&mut self.rng)
                    .unwrap_or(&"tril");
                let key = if name == "diagonal" {
                    "offset"
                } else {
                    "diagonal"
                };
                self.try_op(name, &[x], &[(key, int(off))]);
            }
            10 => {
                let reps: Vec<i64> = (0..rank).map(|_| self.rng.random_range(1..3)).collect();
                self.try_op("repeat", &[x], &[("repeats", list(reps))]);
            }
            _ => {
                let name = *["contiguous", "t"].choose(&mut self.rng).unwrap_or(&"t");
                self.try_op(name, &[x], &[]);
            }
        }
    }

    fn combine(&mut self, x: ValueId, tx: &TensorType) {
        let y = self.pick();
        let y = if self.ty(y).shape == tx.shape { y } else { x };
        let d = self.dim_of(tx.ndim() + 1);
        let name = *["cat", "stack"].choose(&mut self.rng).unwrap_or(&"cat");
        let d = if name == "cat" {
            self.dim_of(tx.ndim())
        } else {
            d
        };
        self.try_op(name, &[x, y], &[("dim", Attr::Int(d))]);
    }

    fn select_values(&mut self, x: ValueId) {
        let zero = self
            .g
            .add_scalar(Scalar::Float(0.0))
            .expect("a scalar is always valid");
        let cmp = *["gt", "lt", "ge", "eq"]
            .choose(&mut self.rng)
            .unwrap_or(&"gt");
        let Some(c) = self.try_op(cmp, &[x, zero], &[]) else {
            return;
        };
        if self.rng.random_bool(0.5) {
            let y = self.other(x);
            self.try_op("where", &[c, x, y], &[]);
        } else {
            let v = Attr::Float(*[0.0, -2.0, 1.5].choose(&mut self.rng).unwrap_or(&0.0));
            self.try_op("masked_fill", &[x, c], &[("value", v)]);
        }
    }

    /// matmul, linear or einsum of `x` with a new input of a fitting shape.
    fn contract(&mut self, x: ValueId, tx: &TensorType) {
        let rank = tx.ndim();
        if rank == 0 || !tx.dtype.is_float() {
            return;
        }
        let k = tx.shape[rank - 1];
        let n = *[1, 3, 8, 17, 64, 256, 300]
            .choose(&mut self.rng)
            .unwrap_or(&8);
        match self.rng.random_range(0..3) {
            0 => {
                let w = self.input(tx.dtype, vec![k, n]);
                let (a, b) = if self.rng.random_bool(0.2) && rank >= 2 {
                    // the transposed side
                    let t = self.try_op("t", &[w], &[]);
                    let xt = self.try_op(
                        "transpose",
                        &[x],
                        &[("dim0", Attr::Int(-1)), ("dim1", Attr::Int(-2))],
                    );
                    match (t, xt) {
                        (Some(t), Some(xt)) => (t, xt),
                        _ => return,
                    }
                } else {
                    (x, w)
                };
                self.try_op("matmul", &[a, b], &[]);
            }
            1 => {
                let w = self.input(tx.dtype, vec![n, k]);
                if self.rng.random_bool(0.5) {
                    let b = self.input(tx.dtype, vec![n]);
                    self.try_op("linear", &[x, w, b], &[]);
                } else {
                    self.try_op("linear", &[x, w], &[]);
                }
            }
            _ if rank == 2 => {
                let w = self.input(tx.dtype, vec![k, n]);
                let eq = *["ij,jk->ik", "ij,jk->ki", "ij,jk->i", "ij,jk->"]
                    .choose(&mut self.rng)
                    .unwrap_or(&"ij,jk->ik");
                self.try_op("einsum", &[x, w], &[("equation", Attr::Str(eq.into()))]);
            }
            _ => {}
        }
    }

    fn index(&mut self, x: ValueId, tx: &TensorType) {
        let rank = tx.ndim();
        if rank == 0 {
            return;
        }
        let d = self.rng.random_range(0..rank);
        let size = tx.shape[d];
        if size == 0 {
            return;
        }
        let m = *[1, 2, 5, 9].choose(&mut self.rng).unwrap_or(&2);
        match self.rng.random_range(0..4) {
            0 => {
                let i = self.index_input(vec![m], size);
                self.try_op("index_select", &[x, i], &[("dim", Attr::Int(d as i64))]);
            }
            1 => {
                let mut s = tx.shape.clone();
                s[d] = m;
                let i = self.index_input(s, size);
                self.try_op("gather", &[x, i], &[("dim", Attr::Int(d as i64))]);
            }
            2 if rank == 2 => {
                let ids = self.shape(2);
                let i = self.index_input(ids, tx.shape[0]);
                self.try_op("embedding", &[x, i], &[]);
            }
            _ => {
                // scatter_add of a source into a copy of x
                let mut s = tx.shape.clone();
                s[d] = m;
                let i = self.index_input(s.clone(), size);
                let src = self.input(tx.dtype, s);
                self.try_op("scatter_add", &[x, i, src], &[("dim", Attr::Int(d as i64))]);
            }
        }
    }

    fn image(&mut self, x: ValueId, tx: &TensorType) {
        let (c, h, w) = (tx.shape[1], tx.shape[2], tx.shape[3]);
        let int2 = |a: usize| Attr::Int(a as i64);
        match self.rng.random_range(0..5) {
            0 | 1 => {
                let k = *[1, 3].choose(&mut self.rng).unwrap_or(&3);
                let groups = if c % 2 == 0 && self.rng.random_bool(0.3) {
                    2
                } else {
                    1
                };
                let groups = if self.rng.random_bool(0.15) {
                    c.max(1)
                } else {
                    groups
                };
                let out = *[1, 4, 8].choose(&mut self.rng).unwrap_or(&4) * groups;
                let wt = self.input(tx.dtype, vec![out, c / groups.max(1), k, k]);
                let stride = *[1, 1, 2].choose(&mut self.rng).unwrap_or(&1);
                let pad = self.rng.random_range(0..=k / 2 + 1);
                let mut ops = vec![x, wt];
                if self.rng.random_bool(0.5) {
                    ops.push(self.input(tx.dtype, vec![out]));
                }
                self.try_op(
                    "conv2d",
                    &ops,
                    &[
                        ("stride", int2(stride)),
                        ("padding", int2(pad)),
                        ("groups", int2(groups)),
                    ],
                );
            }
            2 => {
                let k = (*[1, 2, 3].choose(&mut self.rng).unwrap_or(&2)).min(h.min(w).max(1));
                let name = *["max_pool2d", "avg_pool2d"]
                    .choose(&mut self.rng)
                    .unwrap_or(&"max_pool2d");
                let pad = self.rng.random_range(0..=k / 2);
                self.try_op(
                    name,
                    &[x],
                    &[("kernel_size", int2(k)), ("padding", int2(pad))],
                );
            }
            3 => {
                let o = *[1, 2, 3].choose(&mut self.rng).unwrap_or(&1);
                self.try_op("adaptive_avg_pool2d", &[x], &[("output_size", int2(o))]);
            }
            _ => {
                let mean = self.input(tx.dtype, vec![c]);
                let var = self.input(tx.dtype, vec![c]);
                self.constants.extend([mean, var]);
                let weight = self.input(tx.dtype, vec![c]);
                let bias = self.input(tx.dtype, vec![c]);
                // running variances must be positive
                let var = self.try_op("abs", &[var], &[]).unwrap_or(var);
                self.try_op("batch_norm", &[x, mean, var, weight, bias], &[]);
            }
        }
    }

    fn attention(&mut self, x: ValueId, tx: &TensorType) {
        let rank = tx.ndim();
        if rank < 2 || !tx.dtype.is_float() {
            return;
        }
        let e = tx.shape[rank - 1];
        let mut kv = tx.shape.clone();
        kv[rank - 2] = *[1, 5, 7, 16].choose(&mut self.rng).unwrap_or(&5);
        let k = self.input(tx.dtype, kv.clone());
        let mut vs = kv;
        vs[rank - 1] = *[e, 3].choose(&mut self.rng).unwrap_or(&e);
        let v = self.input(tx.dtype, vs);
        let causal = Attr::Bool(self.rng.random_bool(0.4));
        self.try_op(
            "scaled_dot_product_attention",
            &[x, k, v],
            &[("is_causal", causal)],
        );
    }

    fn finish(mut self, family: Family) -> Case {
        let made: Vec<ValueId> = self
            .pool
            .iter()
            .copied()
            .filter(|&v| !self.g.inputs().contains(&v))
            .collect();
        let mut outs: Vec<ValueId> = made.last().into_iter().copied().collect();
        if made.len() > 1 && self.rng.random_bool(0.5) {
            let extra = made[self.rng.random_range(0..made.len() - 1)];
            outs.push(extra);
        }
        if outs.is_empty() {
            outs.push(self.pool[0]);
        }
        self.g.set_outputs(outs);
        let mut text = String::new();
        for (name, lo, hi) in &self.ranges {
            text.push_str(&format!("# range %{name} {lo} {hi}\n"));
        }
        for &v in &self.constants {
            text.push_str(&format!("# constant %{}\n", self.g.node(v).name));
        }
        text.push_str(&print_module(&Module {
            graphs: vec![self.g],
        }));
        Case {
            text,
            family,
            ops: self.ops,
        }
    }
}

/// A graph of loops and branches: `fori_loop` and `cond` (nested up to twice) around bodies
/// drawn like [`Family::General`] graphs over the carried value.
fn control_case(mut rng: StdRng, n_ops: usize) -> Case {
    let dt = *[DType::F32, DType::F64]
        .choose(&mut rng)
        .unwrap_or(&DType::F32);
    let rank = rng.random_range(0..3);
    let shape: Vec<usize> = (0..rank)
        .map(|_| *[1, 2, 3, 5, 7, 17].choose(&mut rng).unwrap_or(&3))
        .collect();
    let ty = crate::ir::text::fmt_type(&TensorType::new(dt, shape.clone()));
    let mut bodies: Vec<String> = Vec::new();
    let mut ops: Vec<&'static str> = Vec::new();
    let per_body = (n_ops / 2).max(2);
    let top = control_op(&mut rng, (dt, &shape), per_body, 2, &mut bodies, &mut ops);
    let mut text = format!("graph fuzz(%x: {ty}) {{\n");
    text.push_str(&top.replace("%CARRY", "%x"));
    text.push_str("  return %out\n}\n");
    for b in bodies {
        text.push_str(&b);
    }
    Case {
        text,
        family: Family::Control,
        ops,
    }
}

/// The statements of one control op over `%CARRY` whose result is `%out`, its bodies
/// appended to `bodies` (`depth`: how many more levels may nest).
fn control_op(
    rng: &mut StdRng,
    carry: (DType, &[usize]),
    n_ops: usize,
    depth: usize,
    bodies: &mut Vec<String>,
    ops: &mut Vec<&'static str>,
) -> String {
    // names drawn at random, so that nested bodies never collide; in decimal, so that no
    // name holds a dtype's name (`bf16`) that the oracle's f64 text would rewrite
    let name = |rng: &mut StdRng| format!("b{}", rng.random::<u32>());
    if rng.random_bool(0.5) {
        let trips = rng.random_range(0..4);
        let b = name(rng);
        let body = body_graph(rng, &b, true, carry, n_ops, depth, bodies, ops);
        bodies.push(body);
        ops.push("fori_loop");
        format!("  %out = fori_loop(0, {trips}, %CARRY, body=@{b})\n")
    } else {
        let (t, e) = (name(rng), name(rng));
        let then = body_graph(rng, &t, false, carry, n_ops, depth, bodies, ops);
        bodies.push(then);
        let other = body_graph(rng, &e, false, carry, n_ops, depth, bodies, ops);
        bodies.push(other);
        ops.push("cond");
        format!(
            "  %sum = sum(%CARRY)\n  %pred = gt(%sum, 0.0)\n  %out = cond(%pred, %CARRY, then=@{t}, else=@{e})\n"
        )
    }
}

/// A body taking the carry (after the step `%i` for a loop) and returning a value of its
/// type: general ops on the carry, maybe a nested control op, then the carry halved plus
/// the tanh of what they made (a sum where the shapes differ), so that loops stay finite.
#[allow(clippy::too_many_arguments)]
fn body_graph(
    rng: &mut StdRng,
    name: &str,
    looped: bool,
    (dt, shape): (DType, &[usize]),
    n_ops: usize,
    depth: usize,
    bodies: &mut Vec<String>,
    ops: &mut Vec<&'static str>,
) -> String {
    let mut g = Graph::new(name);
    if looped {
        let _ = g.add_input("i", TensorType::new(DType::I64, Vec::<usize>::new()));
    }
    let mut b = Gen {
        rng: StdRng::seed_from_u64(rng.random()),
        g,
        pool: Vec::new(),
        dtype: dt,
        ranges: Vec::new(),
        constants: Vec::new(),
        ops: Vec::new(),
        closed: true,
    };
    let c = b.input(dt, shape.to_vec());
    let mut tries = 0;
    while b.ops.len() < n_ops && tries < n_ops * 8 {
        tries += 1;
        b.step(Family::General);
    }
    let made = b.pool.last().copied().filter(|&v| v != c).unwrap_or(c);
    let ty = b.ty(made);
    let made = match ty.dtype == dt {
        true => made,
        false => b
            .try_op("to", &[made], &[("dtype", Attr::DType(dt))])
            .unwrap_or(c),
    };
    let made = match b.ty(made).shape.as_slice() == shape {
        true => made,
        false => b.try_op("sum", &[made], &[]).unwrap_or(c),
    };
    let squashed = b.try_op("tanh", &[made], &[]).unwrap_or(c);
    let half =
        b.g.add_scalar(Scalar::Float(0.5))
            .expect("a scalar is always valid");
    let kept = b.try_op("mul", &[c, half], &[]).unwrap_or(c);
    let mut out = b.try_op("add", &[kept, squashed], &[]).unwrap_or(c);
    ops.extend(b.ops.iter().copied());
    let mut nested = String::new();
    if depth > 1 && rng.random_bool(0.4) {
        // a control op inside this body, over what it returns
        let carried = b.g.node(out).name.clone();
        nested = control_op(rng, (dt, shape), n_ops, depth - 1, bodies, ops)
            .replace("%CARRY", &format!("%{carried}"))
            .replace("%out", "%nested_out")
            .replace("%sum", "%nested_sum")
            .replace("%pred", "%nested_pred");
        out = c; // placeholder, replaced below
    }
    b.g.set_outputs(vec![out]);
    let text = crate::ir::text::print_graph(&b.g);
    if nested.is_empty() {
        return text;
    }
    // splice the nested op before the return, and return its result
    let ret = text.rfind("  return ").unwrap_or(text.len());
    format!("{}{nested}  return %nested_out\n}}\n", &text[..ret])
}
