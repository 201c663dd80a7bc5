//! Attention as one op (online softmax, nothing of size [T, T] stored) against the same
//! attention written as matmul, softmax, matmul (the [T, T] probabilities materialised), in
//! the same run, taking turns over rounds; f32, 2 threads on the benchmark machines.
//!
//! A second table times a training step of attention (forward, then backward of its sum):
//! the fused op's gradient (one `scaled_dot_product_attention_backward` call that
//! recomputes the probabilities per block of query rows) against the gradients of the
//! matmul·softmax·matmul form, with the peak memory each allocates.
//!
//! Run: `cargo bench --bench attention`.

#[allow(dead_code)] // shared with the other benches; this one needs only `median_ms`
mod timing;

use smelt::{DType, Generator, Tensor};
use std::hint::black_box;
use timing::median_ms;

const ROUNDS: usize = 5;

fn main() {
    println!("attention, f32, median of {ROUNDS} rounds (range); causal");
    println!(
        "| batch × heads × T × d | fused op | matmul·softmax·matmul | speedup | GFLOP/s fused |"
    );
    println!("|---|---|---|---|---|");
    for &(b, h, t, d) in &[
        (4usize, 8usize, 256usize, 64usize),
        (2, 8, 1024, 64),
        (1, 4, 2048, 64),
    ] {
        let mut g = Generator::new(0);
        let shape = [b, h, t, d];
        let q = Tensor::randn_with(&shape, Some(DType::F32), &mut g).unwrap();
        let k = Tensor::randn_with(&shape, Some(DType::F32), &mut g).unwrap();
        let v = Tensor::randn_with(&shape, Some(DType::F32), &mut g).unwrap();
        let ones = Tensor::ones(&[t, t], DType::Bool);
        let causal = ones.tril(0).unwrap();
        let scale = 1.0 / (d as f64).sqrt();
        let fused = || {
            drop(black_box(
                q.scaled_dot_product_attention(&k, &v, None, true, None)
                    .unwrap(),
            ))
        };
        let unfused = || {
            let s = q
                .matmul(&k.transpose(-2, -1).unwrap())
                .unwrap()
                .mul_scalar(scale)
                .unwrap()
                .masked_fill(&causal.logical_not().unwrap(), f64::NEG_INFINITY)
                .unwrap();
            let p = s.softmax(-1).unwrap();
            drop(black_box(p.matmul(&v).unwrap()))
        };
        let (mut tf, mut tu) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            tf.push(median_ms(3, fused));
            tu.push(median_ms(3, unfused));
        }
        tf.sort_by(f64::total_cmp);
        tu.sort_by(f64::total_cmp);
        let (mf, mu) = (tf[ROUNDS / 2], tu[ROUNDS / 2]);
        // causal: about half of the 4·T²·d multiply-adds
        let flops = 2.0 * (b * h) as f64 * (t * t) as f64 * d as f64;
        println!(
            "| {b} × {h} × {t} × {d} | {mf:.2} ms ({:.2}–{:.2}) | {mu:.2} ms ({:.2}–{:.2}) | {:.2} | {:.1} |",
            tf[0],
            tf[ROUNDS - 1],
            tu[0],
            tu[ROUNDS - 1],
            mu / mf,
            flops / (mf * 1e6)
        );
    }
    heads_in_place();
    training();
}

/// Forward and backward of attention's sum, fused op against matmul·softmax·matmul: ms
/// (median of the rounds, range) and the peak memory the profiler records for one step.
fn training() {
    use smelt::profiler::{self, MemDevice, ProfilerOptions};
    println!();
    println!("attention forward + backward, f32, median of {ROUNDS} rounds (range); causal");
    println!(
        "| batch × heads × T × d | fused op | matmul·softmax·matmul | speedup | peak MB fused | peak MB matmul form |"
    );
    println!("|---|---|---|---|---|---|");
    for &(b, h, t, d) in &[
        (32usize, 4usize, 32usize, 24usize),
        (4, 8, 256, 64),
        (2, 8, 1024, 64),
    ] {
        let mut g = Generator::new(2);
        let shape = [b, h, t, d];
        let qkv: Vec<Tensor> = (0..3)
            .map(|_| Tensor::randn_with(&shape, Some(DType::F32), &mut g).unwrap())
            .collect();
        for x in &qkv {
            x.requires_grad_(true).unwrap();
        }
        let hidden = Tensor::ones(&[t, t], DType::Bool)
            .tril(0)
            .unwrap()
            .logical_not()
            .unwrap();
        let scale = 1.0 / (d as f64).sqrt();
        let step = |fused: bool| {
            let (q, k, v) = (&qkv[0], &qkv[1], &qkv[2]);
            let o = if fused {
                q.scaled_dot_product_attention(k, v, None, true, None)
                    .unwrap()
            } else {
                let s = q
                    .matmul(&k.transpose(-2, -1).unwrap())
                    .unwrap()
                    .mul_scalar(scale)
                    .unwrap()
                    .masked_fill(&hidden, f64::NEG_INFINITY)
                    .unwrap();
                s.softmax(-1).unwrap().matmul(v).unwrap()
            };
            o.sum().unwrap().backward().unwrap();
            smelt::autograd::zero_grad(&qkv);
        };
        let peak = |fused: bool| {
            let opts = ProfilerOptions::default().profile_memory(true);
            let ((), p) = profiler::profile(opts, || step(fused)).unwrap();
            p.peak_memory(MemDevice::Cpu) as f64 / 1e6
        };
        let (mut tf, mut tu) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            tf.push(median_ms(3, || step(true)));
            tu.push(median_ms(3, || step(false)));
        }
        tf.sort_by(f64::total_cmp);
        tu.sort_by(f64::total_cmp);
        let (mf, mu) = (tf[ROUNDS / 2], tu[ROUNDS / 2]);
        println!(
            "| {b} × {h} × {t} × {d} | {mf:.2} ms ({:.2}–{:.2}) | {mu:.2} ms ({:.2}–{:.2}) | {:.2} | {:.1} | {:.1} |",
            tf[0],
            tf[ROUNDS - 1],
            tu[0],
            tu[ROUNDS - 1],
            mu / mf,
            peak(true),
            peak(false)
        );
    }
}

/// The GPT's attention: q, k and v as heads sliced out of one fused [B, T, 3, H, D]
/// projection and permuted to [B, H, T, D] (read where they lie), against contiguous ones.
fn heads_in_place() {
    let (b, t, h, d) = (32, 32, 4, 24);
    let mut g = Generator::new(1);
    let qkv = Tensor::randn_with(&[b, t, 3, h, d], Some(DType::F32), &mut g).unwrap();
    let head = |i: i64| qkv.select(2, i).unwrap().permute(&[0, 2, 1, 3]).unwrap();
    let (q, k, v) = (head(0), head(1), head(2));
    let dense = |x: &Tensor| x.contiguous().unwrap();
    let (qc, kc, vc) = (dense(&q), dense(&k), dense(&v));
    let run = |q: &Tensor, k: &Tensor, v: &Tensor| {
        drop(black_box(
            q.scaled_dot_product_attention(k, v, None, true, None)
                .unwrap(),
        ))
    };
    let (mut ts, mut tc) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        ts.push(median_ms(40, || run(&q, &k, &v)));
        tc.push(median_ms(40, || run(&qc, &kc, &vc)));
    }
    ts.sort_by(f64::total_cmp);
    tc.sort_by(f64::total_cmp);
    println!();
    println!("causal attention {b} × {h} × {t} × {d}, median of 40 calls, {ROUNDS} rounds");
    println!("| operands | µs (range) |");
    println!("|---|---|");
    for (what, t) in [("heads of a fused projection", &ts), ("contiguous", &tc)] {
        println!(
            "| {what} | {:.0} ({:.0}–{:.0}) |",
            t[ROUNDS / 2] * 1e3,
            t[0] * 1e3,
            t[ROUNDS - 1] * 1e3
        );
    }
}
