//! The gradient of `x**2 + 3x` at x = 2 is `2x + 3 = 7`, eagerly and through the graph pass.

use smelt::ir::graph::GraphBuilder;
use smelt::ir::op::BinaryOp;
use smelt::{DType, Result, Tensor};

fn main() -> Result<()> {
    // Eager: the ops are recorded as they run; backward differentiates the recording.
    let x = Tensor::scalar(2.0);
    x.requires_grad_(true)?;
    let y = x.pow_scalar(2)?.add(&x.mul_scalar(3)?)?;
    y.backward()?;
    let g = x.grad().map(|g| g.item_f64()).transpose()?;
    println!("eager: y = {}, dy/dx = {:?}", y.item_f64()?, g);

    // Graph: the autodiff pass appends the gradient to the graph as `grad_x`.
    let mut b = GraphBuilder::new("f");
    let xv = b.input("x", DType::F32, &[])?;
    let sq = b.binary_scalar(BinaryOp::Pow, xv, 2)?;
    let tx = b.mul_scalar(xv, 3)?;
    let yv = b.add(sq, tx)?;
    let graph = b.finish(&[yv])?;
    let grad_graph = smelt::passes::autodiff::autodiff(&graph, &["x"])?;
    println!("{}", smelt::ir::print_graph(&grad_graph));
    let out = smelt::runtime::interp::run(&grad_graph, &[("x", Tensor::scalar(2.0))])?;
    println!(
        "graph: y = {}, dy/dx = {}",
        out[0].item_f64()?,
        out[1].item_f64()?
    );
    Ok(())
}
