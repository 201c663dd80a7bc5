//! A walk through smelt's tensor surface, then traced functions compiled into fused kernels
//! (the seeds' `relu(x) * 0.5 + b`, an MLP block, softmax, layer_norm): each schedule is
//! printed unfused and fused, checked against the interpreter and timed kernel by kernel.
//!
//! Run: `cargo run --release --example tour`

use smelt::exec::{CompileOptions, CompiledFn, KernelBackend};
use smelt::ir::graph::Graph;
use smelt::{DType, Result, Tensor, tensor};
use std::time::Instant;

fn section(title: &str) {
    println!("\n== {title} ==");
}

fn main() -> Result<()> {
    smelt::runtime::random::manual_seed(0);

    section("creation");
    let a = tensor![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]?;
    println!("a = {a}");
    println!("zeros_like(a) = {}", a.zeros_like());
    println!("arange(0, 10, 3) = {}", Tensor::arange(0, 10, 3, None)?);
    println!("randn([2, 3]) = {}", Tensor::randn(&[2, 3], None)?);

    section("zero-copy buffers");
    let data = vec![0.0f32; 4];
    let addr = data.as_ptr() as usize;
    let t = Tensor::from_vec(data, &[2, 2])?;
    t.select(0, 1)?.with_slice_mut::<f32, _>(|s| s[0] = 7.0)?;
    println!(
        "same memory: {}, after a write through a view: {t}",
        t.data_ptr() == addr
    );

    section("views never copy");
    let tt = a.t()?;
    println!(
        "a.t() contiguous? {}  strides {:?}",
        tt.is_contiguous(),
        tt.strides()
    );
    match tt.view(&[6]) {
        Ok(_) => println!("unexpected: view of a transpose worked"),
        Err(e) => println!("a.t().view([6]) fails: {e}"),
    }
    println!(
        "a.t().contiguous().view([6]) = {}",
        tt.contiguous()?.view(&[6])?
    );
    let col = Tensor::arange(0.0, 3.0, 1.0, None)?.view(&[3, 1])?;
    let e = col.expand(&[3, 4])?;
    println!(
        "expand shares storage: {}, repeat does not: {}",
        e.shares_storage(&col),
        !col.repeat(&[1, 4])?.shares_storage(&col)
    );

    section("broadcasting");
    let row = Tensor::arange(0.0, 4.0, 1.0, None)?.view(&[1, 4])?;
    println!("[3,1] + [1,4] = {}", &col + &row);

    section("in-place and indexing");
    let x = Tensor::zeros(&[3, 4], DType::F32);
    x.narrow(1, 1, 2)?.fill_(1.0)?;
    println!("fill_ through a narrow view: {x}");
    let idx = Tensor::from_vec(vec![2i64, 0], &[2])?;
    println!(
        "index_select rows [2, 0] of col+row: {}",
        (&col + &row).index_select(0, &idx)?
    );

    section("reductions and matmul");
    let m = Tensor::randn(&[64, 128], None)?;
    let w = Tensor::randn(&[128, 32], None)?;
    let y = m.matmul(&w)?;
    println!(
        "(64x128)·(128x32) -> {:?}; softmax rows sum to {}",
        y.shape(),
        y.softmax(-1)?.sum_dim(&[1], false)?.mean()?
    );
    println!(
        "einsum('ij,jk->ik') equals matmul: {}",
        Tensor::einsum("ij,jk->ik", &[&m, &w])?
            .sub(&y)?
            .abs()?
            .amax()?
            .item_f64()?
            < 1e-4
    );

    section("tracing relu(x) * 0.5 + b");
    let b = Tensor::randn(&[1024], None)?;
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        Ok(vec![xs[0].relu()?.mul_scalar(0.5)?.add(&xs[1])?])
    };
    let x = Tensor::randn(&[1024, 1024], None)?;
    let traced = smelt::jit::trace(f, &[x.clone(), b.clone()])?;
    let t0 = Instant::now();
    let eager = f(&[x.clone(), b.clone()])?;
    let t_eager = t0.elapsed();
    let t0 = Instant::now();
    let out = traced.call(&[x.clone(), b.clone()])?;
    let t_graph = t0.elapsed();
    println!(
        "eager {:?}, interpreted graph {:?}, max |diff| = {}",
        t_eager,
        t_graph,
        out[0].sub(&eager[0])?.abs()?.amax()?.item_f64()?
    );
    compile_and_profile(traced.graph(), &[x, b])?;

    section("an MLP block: linear, gelu, linear");
    let w1 = Tensor::randn(&[256, 512], None)?.mul_scalar(0.05)?;
    let b1 = Tensor::randn(&[512], None)?;
    let w2 = Tensor::randn(&[512, 256], None)?.mul_scalar(0.05)?;
    let b2 = Tensor::randn(&[256], None)?;
    let mlp = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let h = xs[0].matmul(&xs[1])?.add(&xs[2])?.gelu()?;
        Ok(vec![h.matmul(&xs[3])?.add(&xs[4])?])
    };
    let x = Tensor::randn(&[128, 256], None)?;
    let ins = [x, w1, b1, w2, b2];
    let traced = smelt::jit::trace(mlp, &ins)?;
    compile_and_profile(traced.graph(), &ins)?;

    section("softmax over the last dim");
    let x = Tensor::randn(&[512, 1024], None)?;
    let traced = smelt::jit::trace(
        |xs: &[Tensor]| Ok(vec![xs[0].softmax(-1)?]),
        std::slice::from_ref(&x),
    )?;
    compile_and_profile(traced.graph(), &[x])?;

    section("layer_norm");
    let x = Tensor::randn(&[512, 1024], None)?;
    let w = Tensor::randn(&[1024], None)?;
    let b = Tensor::randn(&[1024], None)?;
    let ln = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        Ok(vec![xs[0].layer_norm(
            &[1024],
            Some(&xs[1]),
            Some(&xs[2]),
            1e-5,
        )?])
    };
    let ins = [x, w, b];
    let traced = smelt::jit::trace(ln, &ins)?;
    compile_and_profile(traced.graph(), &ins)?;
    Ok(())
}

/// The kernel backend of this build: Cranelift code when the lowering is built in, else the
/// kernel-IR interpreter (said once).
fn backend(g: &Graph) -> KernelBackend {
    static SAID: std::sync::Once = std::sync::Once::new();
    match CompiledFn::compile(g, &CompileOptions::default()) {
        Ok(_) => KernelBackend::Cranelift,
        Err(e) => {
            SAID.call_once(|| println!("(kernels run on the kernel-IR interpreter: {e})"));
            KernelBackend::Interp
        }
    }
}

/// Compiles `g` fused and unfused, prints both schedules' kernels, checks them against the
/// interpreter and times each kernel.
fn compile_and_profile(g: &Graph, inputs: &[Tensor]) -> Result<()> {
    let be = backend(g);
    println!("graph:\n{}", smelt::ir::print_graph(g));
    let want = smelt::jit::run_graph(g, inputs)?;
    for fuse in [false, true] {
        let f = CompiledFn::compile(g, &CompileOptions::with_backend(be).fused(fuse))?;
        if fuse {
            println!("fused schedule:\n{}", f.schedule());
        }
        let got = f.call(inputs)?;
        let diff = got[0].sub(&want[0])?.abs()?.amax()?.item_f64()?;
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); f.steps().len()];
        let mut total = Vec::new();
        for _ in 0..5 {
            let t0 = Instant::now();
            let (_, t) = f.call_timed(inputs)?;
            total.push(t0.elapsed().as_secs_f64() * 1e3);
            for (i, d) in t.0.iter().enumerate() {
                times[i].push(d.as_secs_f64() * 1e3);
            }
        }
        println!(
            "{} ({}): {} steps, median {:.3} ms, max |diff| vs interpreter {diff:e}",
            if fuse { "fused" } else { "unfused" },
            be.name(),
            f.steps().len(),
            median(total)
        );
        for (s, t) in f.steps().iter().zip(times) {
            let ms = median(t);
            println!(
                "  {:<22} {:>9.4} ms {:>8.2} GB/s  {}",
                s.name,
                ms,
                s.bytes as f64 / (ms * 1e6),
                s.ops.join(" ")
            );
        }
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
