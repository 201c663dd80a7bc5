//! What several test files share: the random-graph generator the differential tests of the
//! fuser and the CPU code generator draw from.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smelt::ir::graph::{Graph, ValueId};
use smelt::ir::op::{BinaryOp, Op, ReduceOp, TensorType, UnaryOp};
use smelt::{DType, Scalar};

fn input(g: &mut Graph, name: &str, dtype: DType, shape: &[usize]) -> ValueId {
    g.add_input(name, TensorType::new(dtype, shape.to_vec()))
        .unwrap()
}

fn num(g: &mut Graph, v: f64) -> ValueId {
    g.add_scalar(Scalar::Float(v)).unwrap()
}

/// Builds a random graph of pointwise, broadcast, view, reduction and matmul ops over `[a, b]`.
pub fn random_graph(seed: u64, n_ops: usize) -> Graph {
    let mut rng = StdRng::seed_from_u64(seed);
    let dims = [1usize, 3, 7];
    let (a, b) = (dims[rng.random_range(0..3)], dims[rng.random_range(0..3)]);
    let dtype = if rng.random_bool(0.8) {
        DType::F32
    } else {
        DType::F64
    };
    let mut g = Graph::new("random");
    let mut pool = vec![
        input(&mut g, "x", dtype, &[a, b]),
        input(&mut g, "y", dtype, &[b]),
        input(&mut g, "z", dtype, &[a, 1]),
    ];
    let xt = input(&mut g, "xt", dtype, &[b, a]);
    pool.push(g.add_op(Op::T, &[xt]).unwrap());
    for _ in 0..n_ops {
        let pick = |rng: &mut StdRng, pool: &[ValueId]| pool[rng.random_range(0..pool.len())];
        let x = pick(&mut rng, &pool);
        let y = pick(&mut rng, &pool);
        let nd = g.node(x).ty.ndim() as i64;
        let op: (Op, Vec<ValueId>) = match rng.random_range(0..11) {
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
                let s = num(&mut g, rng.random_range(-2.0..2.0));
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
        };
        match g.add_op(op.0, &op.1) {
            Ok(v) if g.node(v).ty.ndim() <= 3 => pool.push(v),
            _ => {}
        }
    }
    let n = pool.len();
    let mut outs = vec![pool[n - 1]];
    for _ in 0..rng.random_range(0..3) {
        outs.push(pool[rng.random_range(4..n.max(5)).min(n - 1)]);
    }
    g.set_outputs(outs);
    g
}
