//! The two-spirals classification data and the MLP the examples train on it.

use smelt::autograd::no_grad;
use smelt::nn::{Linear, Module, ReLU, Sequential};
use smelt::{Generator, Result, Tensor};
use std::f64::consts::PI;

/// Two spirals (class 0 and class 1, half a turn apart) with Gaussian noise, shuffled.
pub fn spirals(n: usize, g: &mut Generator) -> Result<(Tensor, Tensor)> {
    let t = Tensor::rand_with(&[2 * n], None, g)?.to_f64_vec();
    let noise = Tensor::randn_with(&[2 * n, 2], None, g)?.to_f64_vec();
    // A seeded shuffle: the points sorted by random keys.
    let keys = Tensor::rand_with(&[2 * n], None, g)?.to_f64_vec();
    let mut order: Vec<usize> = (0..2 * n).collect();
    order.sort_by(|&a, &b| keys[a].total_cmp(&keys[b]));
    let mut xs = vec![0f32; 4 * n];
    let mut ys = vec![0i64; 2 * n];
    for (row, &i) in order.iter().enumerate() {
        let class = i / n;
        // Radius grows with the angle: 1.5 turns from the centre outwards.
        let a = t[i] * 3.0 * PI;
        let r = 0.1 + t[i];
        let phase = class as f64 * PI;
        xs[2 * row] = (r * (a + phase).cos() + 0.03 * noise[2 * i]) as f32;
        xs[2 * row + 1] = (r * (a + phase).sin() + 0.03 * noise[2 * i + 1]) as f32;
        ys[row] = class as i64;
    }
    Ok((
        Tensor::from_vec(xs, &[2 * n, 2])?,
        Tensor::from_vec(ys, &[2 * n])?,
    ))
}

/// Two copies of the same randomly initialised MLP of `widths` (ReLU between layers).
pub fn twin_models(widths: &[usize], g: &mut Generator) -> Result<(Sequential, Sequential)> {
    let (mut a, mut b) = (Sequential::new(), Sequential::new());
    for (i, io) in widths.windows(2).enumerate() {
        if i > 0 {
            a = a.add(ReLU::new());
            b = b.add(ReLU::new());
        }
        let bound = 1.0 / (io[0] as f64).sqrt();
        let w = Tensor::rand_with(&[io[1], io[0]], None, g)?.to_f64_vec();
        let bias = Tensor::rand_with(&[io[1]], None, g)?.to_f64_vec();
        let init = |v: &[f64], shape: &[usize]| -> Result<Tensor> {
            let v: Vec<f32> = v.iter().map(|u| ((2.0 * u - 1.0) * bound) as f32).collect();
            let t = Tensor::from_vec(v, shape)?;
            t.requires_grad_(true)?;
            Ok(t)
        };
        let shape = [io[1], io[0]];
        a = a.add(Linear::from_tensors(
            init(&w, &shape)?,
            Some(init(&bias, &[io[1]])?),
        )?);
        b = b.add(Linear::from_tensors(
            init(&w, &shape)?,
            Some(init(&bias, &[io[1]])?),
        )?);
    }
    Ok((a, b))
}

/// Share of the points whose largest logit is their class.
pub fn accuracy(model: &Sequential, x: &Tensor, y: &Tensor) -> Result<f64> {
    let _off = no_grad();
    let logits = model.forward(x)?.to_f64_vec();
    let labels = y.to_i64_vec();
    let hits = logits
        .chunks(2)
        .zip(&labels)
        .filter(|(l, c)| i64::from(l[1] > l[0]) == **c)
        .count();
    Ok(hits as f64 / labels.len() as f64)
}
