//! Compiled graphs against eager execution and against a plain memory copy of the same bytes.
//!
//! Run: `cargo bench --bench compiled` (add `-- quick` for fewer repetitions). For each model
//! it prints the median time eager (reference interpreter), compiled unfused (one kernel per
//! op), compiled fused with transcendentals in inline Cranelift code (no native strips) and
//! compiled fused as by default; the fused bandwidth as a share of a same-run copy of the same
//! bytes (`copy_from_slice` split across the threads); the fused/unfused, fused/inline and
//! compiled/eager ratios; then the first-call compile time of each model and of chains of 100
//! and 2000 ops, and the per-size cost of running a small kernel on one thread against
//! splitting it across all (what `PAR_MIN_ELEMS` is chosen from). Kernels run on Cranelift code
//! when the lowering is built in, else on the kernel-IR interpreter (the header says which).

#[allow(dead_code)] // each bench uses a part of the shared timing helpers
mod timing;

use smelt::exec::{CompileOptions, CompiledFn, KernelBackend};
use smelt::ir::graph::{Graph, ValueId};
use smelt::ir::op::{BinaryOp, Op, TensorType, UnaryOp};
use smelt::jit::run_graph;
use smelt::{DType, Error, Scalar, Tensor};
use std::time::Instant;
use timing::{copy_ms, median_ms};

fn input(g: &mut Graph, name: &str, shape: &[usize]) -> ValueId {
    g.add_input(name, TensorType::new(DType::F32, shape.to_vec()))
        .unwrap()
}

fn op(g: &mut Graph, o: Op, xs: &[ValueId]) -> ValueId {
    g.add_op(o, xs).unwrap()
}

fn un(g: &mut Graph, u: UnaryOp, x: ValueId) -> ValueId {
    op(g, Op::Unary(u), &[x])
}

fn scalar_op(g: &mut Graph, b: BinaryOp, x: ValueId, s: f64) -> ValueId {
    let c = g.add_scalar(Scalar::Float(s)).unwrap();
    op(g, Op::Binary(b), &[x, c])
}

fn finish(mut g: Graph, outs: Vec<ValueId>) -> Graph {
    g.set_outputs(outs);
    g
}

const N: usize = 4096;

fn models() -> Vec<Graph> {
    let mut v = Vec::new();

    let mut g = Graph::new("relu(x)*0.5+b");
    let x = input(&mut g, "x", &[N, N]);
    let b = input(&mut g, "b", &[N]);
    let r = un(&mut g, UnaryOp::Relu, x);
    let m = scalar_op(&mut g, BinaryOp::Mul, r, 0.5);
    let y = op(&mut g, Op::Binary(BinaryOp::Add), &[m, b]);
    v.push(finish(g, vec![y]));

    let mut g = Graph::new("chain4 tanh(relu(x*2+1))");
    let x = input(&mut g, "x", &[N, N]);
    let a = scalar_op(&mut g, BinaryOp::Mul, x, 2.0);
    let a = scalar_op(&mut g, BinaryOp::Add, a, 1.0);
    let a = un(&mut g, UnaryOp::Relu, a);
    let a = un(&mut g, UnaryOp::Tanh, a);
    v.push(finish(g, vec![a]));

    let mut g = Graph::new("gelu(tanh)");
    let x = input(&mut g, "x", &[N, N]);
    let y = un(&mut g, UnaryOp::Gelu { tanh: true }, x);
    v.push(finish(g, vec![y]));

    let mut g = Graph::new("softmax(-1)");
    let x = input(&mut g, "x", &[N, N]);
    let y = op(&mut g, Op::Softmax { dim: -1 }, &[x]);
    v.push(finish(g, vec![y]));

    for (name, dim) in [
        ("sum(dim=1)", Some(vec![1])),
        ("sum(dim=0)", Some(vec![0])),
        ("sum()", None),
    ] {
        let mut g = Graph::new(name);
        let x = input(&mut g, "x", &[N, N]);
        let o = Op::Reduce {
            op: smelt::ir::op::ReduceOp::Sum,
            dim,
            keepdim: false,
        };
        let y = op(&mut g, o, &[x]);
        v.push(finish(g, vec![y]));
    }

    let mut g = Graph::new("layer_norm [16384,1024]");
    let x = input(&mut g, "x", &[16384, 1024]);
    let w = input(&mut g, "w", &[1024]);
    let b = input(&mut g, "b", &[1024]);
    let o = Op::LayerNorm {
        normalized_shape: vec![1024],
        eps: 1e-5,
        has_weight: true,
        has_bias: true,
    };
    let y = op(&mut g, o, &[x, w, b]);
    v.push(finish(g, vec![y]));

    let mut g = Graph::new("mlp 256x1024x4096");
    let x = input(&mut g, "x", &[256, 1024]);
    let w1 = input(&mut g, "w1", &[1024, 4096]);
    let b1 = input(&mut g, "b1", &[4096]);
    let w2 = input(&mut g, "w2", &[4096, 1024]);
    let b2 = input(&mut g, "b2", &[1024]);
    let h = op(&mut g, Op::Matmul, &[x, w1]);
    let h = op(&mut g, Op::Binary(BinaryOp::Add), &[h, b1]);
    let a = un(&mut g, UnaryOp::Gelu { tanh: true }, h);
    let y = op(&mut g, Op::Matmul, &[a, w2]);
    let y = op(&mut g, Op::Binary(BinaryOp::Add), &[y, b2]);
    v.push(finish(g, vec![y]));

    let mut g = Graph::new("gemm alone (the mlp's two)");
    let x = input(&mut g, "x", &[256, 1024]);
    let w1 = input(&mut g, "w1", &[1024, 4096]);
    let w2 = input(&mut g, "w2", &[4096, 1024]);
    let h = op(&mut g, Op::Matmul, &[x, w1]);
    let y = op(&mut g, Op::Matmul, &[h, w2]);
    v.push(finish(g, vec![y]));
    v
}

/// A chain of `n` pointwise ops over a small tensor: the compile-time stress case (100 ops
/// for the target; 2000 shows how compile time grows with the graph).
fn chain_ops(n: usize) -> Graph {
    let mut g = Graph::new(&format!("{n} ops"));
    let mut x = input(&mut g, "x", &[64, 64]);
    for i in 0..n {
        x = match i % 4 {
            0 => scalar_op(&mut g, BinaryOp::Mul, x, 0.9),
            1 => scalar_op(&mut g, BinaryOp::Add, x, 0.1),
            2 => un(&mut g, UnaryOp::Tanh, x),
            _ => un(&mut g, UnaryOp::Relu, x),
        };
    }
    finish(g, vec![x])
}

fn bytes_min(g: &Graph) -> usize {
    g.inputs()
        .iter()
        .chain(g.outputs())
        .map(|&v| {
            let t = &g.node(v).ty;
            t.shape.iter().product::<usize>() * t.dtype.size()
        })
        .sum()
}

fn inputs(g: &Graph) -> Vec<Tensor> {
    smelt::manual_seed(0);
    g.inputs()
        .iter()
        .map(|&v| Tensor::randn(&g.node(v).ty.shape, None).unwrap())
        .collect()
}

fn backend() -> KernelBackend {
    // A graph of its own: probing with `hundred_ops` would put its kernel in the process-wide
    // kernel cache and the "first compile" figure below would not include the codegen.
    let mut g = Graph::new("probe");
    let x = input(&mut g, "x", &[3]);
    let y = un(&mut g, UnaryOp::Exp, x);
    let g = finish(g, vec![y]);
    match CompiledFn::compile(&g, &CompileOptions::default()) {
        Ok(_) => KernelBackend::Cranelift,
        Err(Error::Unsupported(why)) => {
            println!("kernels: the kernel-IR interpreter ({why})");
            KernelBackend::Interp
        }
        Err(e) => panic!("{e}"),
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "quick");
    let reps = if quick { 3 } else { 9 };
    let threads = rayon::current_num_threads();
    let be = backend();
    println!(
        "backend {}, {threads} threads, median of {reps} calls after one warm-up\n",
        be.name()
    );
    println!("inline: fused, transcendentals in inline Cranelift code (no native strips)");
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>9} {:>9} {:>9} {:>10}",
        "model",
        "eager",
        "unfused",
        "inline",
        "fused",
        "copy",
        "%copy",
        "fus/unf",
        "fus/inl",
        "comp/eag",
        "compile"
    );
    for g in models() {
        let t0 = Instant::now();
        let fused = CompiledFn::compile(&g, &CompileOptions::with_backend(be)).unwrap();
        let compile = t0.elapsed().as_secs_f64() * 1e3;
        let unfused =
            CompiledFn::compile(&g, &CompileOptions::with_backend(be).fused(false)).unwrap();
        let inline =
            CompiledFn::compile(&g, &CompileOptions::with_backend(be).inline_math(true)).unwrap();
        let ins = inputs(&g);
        let e = median_ms(reps, || drop(run_graph(&g, &ins).unwrap()));
        let u = median_ms(reps, || drop(unfused.call(&ins).unwrap()));
        let i = median_ms(reps, || drop(inline.call(&ins).unwrap()));
        let f = median_ms(reps, || drop(fused.call(&ins).unwrap()));
        let bytes = bytes_min(&g);
        let c = copy_ms(bytes, reps);
        println!(
            "{:<28} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>7.0}% {:>9.2} {:>9.2} {:>9.2} {:>8.2}ms",
            g.name,
            e,
            u,
            i,
            f,
            c,
            100.0 * c / f,
            f / u,
            f / i,
            f / e,
            compile
        );
    }
    for n in [100, 2000] {
        let g = chain_ops(n);
        for fuse in [true, false] {
            let t0 = Instant::now();
            let opts = CompileOptions::with_backend(be).fused(fuse);
            let f = CompiledFn::compile(&g, &opts).unwrap();
            println!(
                "first compile of the {n}-op graph ({}): {:.2} ms, {} kernels",
                if fuse { "fused" } else { "unfused" },
                t0.elapsed().as_secs_f64() * 1e3,
                f.schedule().kernel_count()
            );
        }
    }

    println!("\nsmall kernels: one thread against all (relu(x)*0.5+b over [rows, 1024])");
    println!("{:>10} {:>12} {:>12}", "elements", "1 thread", "all");
    for rows in [1usize, 4, 16, 32, 64, 128, 256, 512] {
        let mut g = Graph::new("small");
        let x = input(&mut g, "x", &[rows, 1024]);
        let b = input(&mut g, "b", &[1024]);
        let r = un(&mut g, UnaryOp::Relu, x);
        let m = scalar_op(&mut g, BinaryOp::Mul, r, 0.5);
        let y = op(&mut g, Op::Binary(BinaryOp::Add), &[m, b]);
        let g = finish(g, vec![y]);
        let ins = inputs(&g);
        let one = CompiledFn::compile(&g, &CompileOptions::with_backend(be).threads(1)).unwrap();
        let all = CompiledFn::compile(&g, &CompileOptions::with_backend(be)).unwrap();
        let t1 = median_ms(reps * 10, || drop(one.call(&ins).unwrap()));
        let ta = median_ms(reps * 10, || drop(all.call(&ins).unwrap()));
        println!("{:>10} {:>10.4}ms {:>10.4}ms", rows * 1024, t1, ta);
    }
}
