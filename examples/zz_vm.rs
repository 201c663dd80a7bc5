use smelt::codegen_cpu::vmath::{StripOp, apply, sum};
use std::time::Instant;
fn main() {
    let mut xs: Vec<f32> = (0..512).map(|i| -(i as f32) * 0.01).collect();
    let orig = xs.clone();
    let reps = 200_000;
    for op in [StripOp::Exp, StripOp::Tanh, StripOp::GeluTanh] {
        let t = Instant::now();
        for _ in 0..reps {
            xs.copy_from_slice(&orig);
            apply(op, &mut xs);
        }
        let ns = t.elapsed().as_nanos() as f64 / (reps as f64 * 512.0);
        println!("{op:?}: {ns:.3} ns/elem");
    }
    let t = Instant::now();
    let mut s = 0.0;
    for _ in 0..reps {
        s += sum(std::hint::black_box(&orig));
    }
    println!(
        "sum: {:.3} ns/elem {s}",
        t.elapsed().as_nanos() as f64 / (reps as f64 * 512.0)
    );
    let t = Instant::now();
    for _ in 0..reps {
        xs.copy_from_slice(std::hint::black_box(&orig));
    }
    println!(
        "copy: {:.3} ns/elem {}",
        t.elapsed().as_nanos() as f64 / (reps as f64 * 512.0),
        xs[3]
    );
}
