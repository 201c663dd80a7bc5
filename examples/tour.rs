//! A walk through smelt's tensor surface, then a traced function: the main job of the README.
//!
//! Run: `cargo run --release --example tour`

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
        tt.contiguous().view(&[6])?
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
    println!("{}", smelt::ir::print_graph(traced.graph()));
    let t0 = Instant::now();
    let eager = f(&[x.clone(), b.clone()])?;
    let t_eager = t0.elapsed();
    let t0 = Instant::now();
    let out = traced.call(&[x, b])?;
    let t_graph = t0.elapsed();
    println!(
        "eager {:?}, interpreted graph {:?}, max |diff| = {}",
        t_eager,
        t_graph,
        out[0].sub(&eager[0])?.abs()?.amax()?.item_f64()?
    );
    Ok(())
}
