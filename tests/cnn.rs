//! Pooling, `batch_norm`, `dropout`, memory formats and the `nn` layers of convolutional
//! networks: values against float64 loops written out here and values PyTorch documents,
//! gradients against finite differences, the interpreter against compiled code, and
//! PyTorch's error messages.

mod common;

use common::close::assert_close;
use smelt::autograd::gradcheck;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::parse_module;
use smelt::nn::{self, Module};
use smelt::optim::Optimizer;
use smelt::runtime::{ConvOptions, MemoryFormat, PoolOptions};
use smelt::{DType, Generator, Tensor};

fn rand(g: &mut Generator, shape: &[usize]) -> Tensor {
    Tensor::randn_with(shape, Some(DType::F64), g).unwrap()
}

/// PyTorch's `pooling_output_shape`.
fn out_len(n: usize, k: usize, s: usize, p: usize, d: usize, ceil: bool) -> usize {
    let span = (n + 2 * p) as i64 - (d * (k - 1)) as i64 - 1 + if ceil { s as i64 - 1 } else { 0 };
    let mut o = span.div_euclid(s as i64) + 1;
    if ceil && (o - 1) * s as i64 >= (n + p) as i64 {
        o -= 1;
    }
    o as usize
}

#[derive(Clone, Copy, Debug)]
struct Pool {
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    ceil: bool,
}

impl Pool {
    fn opts(&self) -> PoolOptions {
        let i = |a: [usize; 2]| [a[0] as i64, a[1] as i64];
        PoolOptions::new(i(self.k))
            .stride(i(self.s))
            .padding(i(self.p))
            .dilation(i(self.d))
            .ceil_mode(self.ceil)
    }
}

/// Max pooling in f64 over [planes, h, w]: the maximum of each window's taps inside the
/// input (a NaN wins).
fn max_ref(x: &[f64], planes: usize, hw: [usize; 2], p: &Pool) -> (Vec<f64>, [usize; 2]) {
    let o: Vec<usize> = (0..2)
        .map(|i| out_len(hw[i], p.k[i], p.s[i], p.p[i], p.d[i], p.ceil))
        .collect();
    let mut y = Vec::new();
    for pl in 0..planes {
        for i in 0..o[0] {
            for j in 0..o[1] {
                let mut m = f64::NEG_INFINITY;
                for a in 0..p.k[0] {
                    for b in 0..p.k[1] {
                        let r = (i * p.s[0] + a * p.d[0]) as i64 - p.p[0] as i64;
                        let c = (j * p.s[1] + b * p.d[1]) as i64 - p.p[1] as i64;
                        if r < 0 || c < 0 || r >= hw[0] as i64 || c >= hw[1] as i64 {
                            continue;
                        }
                        let v = x[(pl * hw[0] + r as usize) * hw[1] + c as usize];
                        if v > m || v.is_nan() {
                            m = v;
                        }
                        if m.is_nan() {
                            break;
                        }
                    }
                }
                y.push(m);
            }
        }
    }
    (y, [o[0], o[1]])
}

/// Average pooling in f64 with PyTorch's divisor: the window clipped to the padded input
/// (`count_include_pad`), or to the input.
fn avg_ref(x: &[f64], planes: usize, hw: [usize; 2], p: &Pool, include_pad: bool) -> Vec<f64> {
    let o: Vec<usize> = (0..2)
        .map(|i| out_len(hw[i], p.k[i], p.s[i], p.p[i], 1, p.ceil))
        .collect();
    let mut y = Vec::new();
    for pl in 0..planes {
        for i in 0..o[0] {
            for j in 0..o[1] {
                let h0 = (i * p.s[0]) as i64 - p.p[0] as i64;
                let w0 = (j * p.s[1]) as i64 - p.p[1] as i64;
                let h1 = (h0 + p.k[0] as i64).min((hw[0] + p.p[0]) as i64);
                let w1 = (w0 + p.k[1] as i64).min((hw[1] + p.p[1]) as i64);
                let padded = (h1 - h0) * (w1 - w0);
                let (h0, w0) = (h0.max(0), w0.max(0));
                let (h1, w1) = (h1.min(hw[0] as i64), w1.min(hw[1] as i64));
                let mut s = 0.0;
                for r in h0..h1 {
                    for c in w0..w1 {
                        s += x[(pl * hw[0] + r as usize) * hw[1] + c as usize];
                    }
                }
                let div = if include_pad {
                    padded
                } else {
                    (h1 - h0) * (w1 - w0)
                };
                y.push(s / div as f64);
            }
        }
    }
    y
}

fn pools() -> Vec<Pool> {
    let p = |k, s, pad, d, ceil| Pool {
        k,
        s,
        p: pad,
        d,
        ceil,
    };
    vec![
        p([2, 2], [2, 2], [0, 0], [1, 1], false),
        p([3, 3], [2, 2], [1, 1], [1, 1], false),
        p([3, 2], [2, 1], [1, 1], [1, 1], true),
        p([2, 3], [3, 2], [1, 0], [1, 1], true),
        p([3, 3], [1, 2], [0, 1], [1, 1], false),
        p([1, 1], [2, 2], [0, 0], [1, 1], true),
    ]
}

#[test]
fn pooling_matches_float64_windows() {
    let mut g = Generator::new(11);
    for (hw, planes) in [([7, 6], (2, 3)), ([5, 9], (1, 2)), ([4, 4], (3, 1))] {
        let x = rand(&mut g, &[planes.0, planes.1, hw[0], hw[1]]);
        let xs = x.to_f64_vec();
        let n = planes.0 * planes.1;
        for p in pools() {
            let (want, o) = max_ref(&xs, n, hw, &p);
            let y = x.max_pool2d(&p.opts()).unwrap();
            assert_eq!(y.shape(), &[planes.0, planes.1, o[0], o[1]], "{p:?}");
            assert_close(&y.to_f64_vec(), &want, 0.0, &format!("max {p:?}"));
            let dilated = Pool { d: [2, 1], ..p };
            if out_len(hw[0], p.k[0], p.s[0], p.p[0], 2, p.ceil) > 0 {
                let (want, _) = max_ref(&xs, n, hw, &dilated);
                let y = x.max_pool2d(&dilated.opts()).unwrap();
                assert_close(&y.to_f64_vec(), &want, 0.0, &format!("max {dilated:?}"));
            }
            for include in [true, false] {
                let want = avg_ref(&xs, n, hw, &p, include);
                let plain = Pool { d: [1, 1], ..p };
                let y = x
                    .avg_pool2d(&plain.opts().count_include_pad(include))
                    .unwrap();
                assert_close(
                    &y.to_f64_vec(),
                    &want,
                    1e-14,
                    &format!("avg {p:?} {include}"),
                );
            }
            // unbatched and channels_last inputs
            let y3 = x.select(0, 0).unwrap().max_pool2d(&p.opts()).unwrap();
            let per = want_len(&y3);
            let (want, _) = max_ref(&xs, n, hw, &p);
            assert_close(&y3.to_f64_vec(), &want[..per], 0.0, "unbatched max");
            let xl = x.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
            let yl = xl.max_pool2d(&p.opts()).unwrap();
            assert_close(&yl.to_f64_vec(), &want, 0.0, "channels_last max");
        }
    }
}

fn want_len(t: &Tensor) -> usize {
    t.numel()
}

#[test]
fn pooling_agrees_with_pytorchs_values() {
    // torch.arange(25.).reshape(1, 1, 5, 5) through F.max_pool2d / F.avg_pool2d
    let x = Tensor::arange(0.0, 25.0, 1.0, Some(DType::F64))
        .unwrap()
        .reshape(&[1, 1, 5, 5])
        .unwrap();
    let y = x.max_pool2d(&PoolOptions::new(2).ceil_mode(true)).unwrap();
    assert_eq!(
        y.to_f64_vec(),
        [6.0, 8.0, 9.0, 16.0, 18.0, 19.0, 21.0, 23.0, 24.0]
    );
    let o = PoolOptions::new(3).stride(2).padding(1).ceil_mode(true);
    let y = x.avg_pool2d(&o).unwrap();
    let want = [
        4.0 / 3.0,
        3.0,
        8.0 / 3.0,
        7.0,
        12.0,
        9.0,
        8.0,
        13.0,
        28.0 / 3.0,
    ];
    assert_close(&y.to_f64_vec(), &want[..], 1e-15, "avg ceil_mode");
    let y = x.avg_pool2d(&o.count_include_pad(false)).unwrap();
    assert_eq!(
        y.to_f64_vec(),
        [3.0, 4.5, 6.0, 10.5, 12.0, 13.5, 18.0, 19.5, 21.0]
    );
    let y = x.adaptive_avg_pool2d([3, 2]).unwrap();
    assert_eq!(y.to_f64_vec(), [3.5, 5.5, 11.0, 13.0, 18.5, 20.5]);
    // max pooling's gradient goes to the first maximal element of each window
    let t = Tensor::from_vec(
        vec![1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 1.0, 1.0, 1.0],
        &[1, 1, 3, 3],
    )
    .unwrap();
    t.requires_grad_(true).unwrap();
    let y = t.max_pool2d(&PoolOptions::new(2).stride(1)).unwrap();
    y.sum().unwrap().backward().unwrap();
    assert_eq!(
        t.grad().unwrap().to_f64_vec(),
        [0.0, 2.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn adaptive_pooling_matches_float64_windows() {
    let mut g = Generator::new(12);
    for (hw, o) in [
        ([7, 5], [3, 2]),
        ([4, 4], [4, 4]),
        ([5, 3], [1, 1]),
        ([3, 3], [5, 4]),
    ] {
        let x = rand(&mut g, &[2, 3, hw[0], hw[1]]);
        let xs = x.to_f64_vec();
        let mut want = Vec::new();
        for pl in 0..6 {
            for i in 0..o[0] {
                for j in 0..o[1] {
                    let (h0, h1) = (i * hw[0] / o[0], ((i + 1) * hw[0]).div_ceil(o[0]));
                    let (w0, w1) = (j * hw[1] / o[1], ((j + 1) * hw[1]).div_ceil(o[1]));
                    let mut s = 0.0;
                    for r in h0..h1 {
                        for c in w0..w1 {
                            s += xs[(pl * hw[0] + r) * hw[1] + c];
                        }
                    }
                    want.push(s / ((h1 - h0) * (w1 - w0)) as f64);
                }
            }
        }
        let y = x.adaptive_avg_pool2d(o).unwrap();
        assert_close(&y.to_f64_vec(), &want, 1e-14, &format!("{hw:?} -> {o:?}"));
    }
}

#[test]
fn pooling_gradients_match_finite_differences() {
    let mut g = Generator::new(13);
    // distinct values, so that max pooling is differentiable at the point
    let x = rand(&mut g, &[2, 2, 6, 5]);
    x.requires_grad_(true).unwrap();
    for p in pools() {
        let o = p.opts();
        let r = gradcheck(|t| t[0].max_pool2d(&o), std::slice::from_ref(&x));
        assert!(r.is_ok(), "max {p:?}: {r:?}");
        for include in [true, false] {
            let o = p.opts().dilation(1).count_include_pad(include);
            let r = gradcheck(|t| t[0].avg_pool2d(&o), std::slice::from_ref(&x));
            assert!(r.is_ok(), "avg {p:?} {include}: {r:?}");
        }
    }
    for o in [[3, 2], [1, 1], [7, 6]] {
        let r = gradcheck(|t| t[0].adaptive_avg_pool2d(o), std::slice::from_ref(&x));
        assert!(r.is_ok(), "adaptive {o:?}: {r:?}");
    }
}

fn err(r: smelt::Result<Tensor>) -> String {
    r.err().map(|e| e.to_string()).unwrap_or_default()
}

#[test]
fn bad_pooling_gives_pytorchs_messages() {
    let x = Tensor::zeros(&[1, 1, 4, 4], DType::F32);
    assert_eq!(
        err(x.max_pool2d(&PoolOptions::new(2).padding(2))),
        "pad should be at most half of effective kernel size, but got pad=2, kernel_size=2 and dilation=1"
    );
    assert_eq!(
        err(x.max_pool2d(&PoolOptions::new(5))),
        "Given input size: (1x4x4). Calculated output size: (1x0x0). Output size is too small"
    );
    assert_eq!(
        err(x.avg_pool2d(&PoolOptions::new(5))),
        "Given input size: (1x4x4). Calculated output size: (1x0x0). Output size is too small"
    );
    assert_eq!(
        err(x.max_pool2d(&PoolOptions::new(2).stride(0))),
        "stride should not be zero"
    );
    assert_eq!(
        err(x.max_pool2d(&PoolOptions::new(2).dilation(0))),
        "dilation should be greater than zero, but got dilationH: 0 dilationW: 0"
    );
    assert_eq!(
        err(Tensor::zeros(&[1, 1, 0, 4], DType::F32).max_pool2d(&PoolOptions::new(2))),
        "Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size for input, but got:[1, 1, 0, 4]"
    );
    assert_eq!(
        err(Tensor::zeros(&[4, 4], DType::F32).adaptive_avg_pool2d(2usize)),
        "adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got [4, 4]"
    );
    // an empty batch pools to an empty batch
    let e = Tensor::zeros(&[0, 2, 4, 4], DType::F32);
    assert_eq!(
        e.max_pool2d(&PoolOptions::new(2)).unwrap().shape(),
        &[0, 2, 2, 2]
    );
    assert_eq!(
        e.avg_pool2d(&PoolOptions::new(2)).unwrap().shape(),
        &[0, 2, 2, 2]
    );
}

/// Batch norm in f64 over [n, c, inner]: per channel, the batch's biased variance or the
/// given statistics.
fn bn_ref(
    x: &[f64],
    (n, c, inner): (usize, usize, usize),
    stats: Option<(&[f64], &[f64])>,
    w: &[f64],
    b: &[f64],
    eps: f64,
) -> Vec<f64> {
    let mut y = vec![0.0; x.len()];
    for ch in 0..c {
        let idx = |i: usize, j: usize| (i * c + ch) * inner + j;
        let vals: Vec<f64> = (0..n)
            .flat_map(|i| (0..inner).map(move |j| (i, j)))
            .map(|(i, j)| x[idx(i, j)])
            .collect();
        let (mean, var) = match stats {
            Some((m, v)) => (m[ch], v[ch]),
            None => {
                let mean = vals.iter().sum::<f64>() / vals.len() as f64;
                let var =
                    vals.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / vals.len() as f64;
                (mean, var)
            }
        };
        for i in 0..n {
            for j in 0..inner {
                y[idx(i, j)] = (x[idx(i, j)] - mean) / (var + eps).sqrt() * w[ch] + b[ch];
            }
        }
    }
    y
}

#[test]
fn batch_norm_normalises_and_updates_running_statistics() {
    // PyTorch's values: F.batch_norm(x, zeros(2), ones(2), training=True)
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 5.0, 4.0, 0.0], &[3, 2]).unwrap();
    let rm = Tensor::zeros(&[2], DType::F32);
    let rv = Tensor::ones(&[2], DType::F32);
    let y =
        nn::functional::batch_norm(&x, Some(&rm), Some(&rv), None, None, true, 0.1, 1e-5).unwrap();
    let want: [f32; 6] = [
        -1.3363018,
        -0.16222113,
        0.26726037,
        1.2977699,
        1.0690415,
        -1.1355485,
    ];
    assert_close(
        &y,
        &Tensor::from_vec(want.to_vec(), &[3, 2]).unwrap(),
        1e-6,
        "y",
    );
    // the unbiased variance goes into the running estimate
    assert_close(
        &rm.to_f64_vec(),
        &[0.26666668, 0.23333333][..],
        1e-6,
        "running mean",
    );
    assert_close(
        &rv.to_f64_vec(),
        &[1.1333333, 1.5333333][..],
        1e-6,
        "running var",
    );

    let mut g = Generator::new(14);
    let x = rand(&mut g, &[3, 4, 5, 2]);
    let (w, b) = (rand(&mut g, &[4]), rand(&mut g, &[4]));
    let (m, v) = (rand(&mut g, &[4]), rand(&mut g, &[4]).abs().unwrap());
    let dims = (3, 4, 10);
    let want = bn_ref(
        &x.to_f64_vec(),
        dims,
        None,
        &w.to_f64_vec(),
        &b.to_f64_vec(),
        1e-5,
    );
    let y = x
        .batch_norm(None, None, Some(&w), Some(&b), true, 0.1, 1e-5)
        .unwrap();
    assert_close(&y.to_f64_vec(), &want, 1e-12, "training");
    let xl = x.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
    let yl = xl
        .batch_norm(None, None, Some(&w), Some(&b), true, 0.1, 1e-5)
        .unwrap();
    assert_eq!(yl.suggest_memory_format(), MemoryFormat::ChannelsLast);
    assert_close(&yl.to_f64_vec(), &want, 1e-12, "training, channels_last");
    // f32 rounds once from the f64 computation
    let y32 = x
        .to_dtype(DType::F32)
        .unwrap()
        .batch_norm(
            None,
            None,
            Some(&w.to_dtype(DType::F32).unwrap()),
            Some(&b.to_dtype(DType::F32).unwrap()),
            true,
            0.1,
            1e-5,
        )
        .unwrap();
    assert_close(&y32.to_f64_vec(), &want, 1e-5, "training, f32");
    let stats = (m.to_f64_vec(), v.to_f64_vec());
    let want = bn_ref(
        &x.to_f64_vec(),
        dims,
        Some((&stats.0, &stats.1)),
        &w.to_f64_vec(),
        &b.to_f64_vec(),
        1e-3,
    );
    let y = x
        .batch_norm(Some(&m), Some(&v), Some(&w), Some(&b), false, 0.1, 1e-3)
        .unwrap();
    assert_close(&y.to_f64_vec(), &want, 1e-12, "evaluation");
    // a channels_last input stays channels_last
    let xl = x.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
    let yl = xl
        .batch_norm(Some(&m), Some(&v), Some(&w), Some(&b), false, 0.1, 1e-3)
        .unwrap();
    assert_eq!(yl.suggest_memory_format(), MemoryFormat::ChannelsLast);
    assert_close(&yl.to_f64_vec(), &want, 1e-12, "channels_last");
    // gradients in both modes
    x.requires_grad_(true).unwrap();
    w.requires_grad_(true).unwrap();
    b.requires_grad_(true).unwrap();
    for training in [true, false] {
        let r = gradcheck(
            |t| {
                t[0].batch_norm(
                    Some(&m),
                    Some(&v),
                    Some(&t[1]),
                    Some(&t[2]),
                    training,
                    0.0,
                    1e-3,
                )
            },
            &[x.clone(), w.clone(), b.clone()],
        );
        assert!(r.is_ok(), "training={training}: {r:?}");
    }
}

#[test]
fn bad_batch_norms_give_pytorchs_messages() {
    let x = Tensor::zeros(&[2, 3, 4], DType::F32);
    let (z4, o4) = (
        Tensor::zeros(&[4], DType::F32),
        Tensor::ones(&[4], DType::F32),
    );
    assert_eq!(
        err(x.batch_norm(Some(&z4), Some(&o4), None, None, false, 0.1, 1e-5)),
        "running_mean should contain 3 elements not 4"
    );
    let one = Tensor::zeros(&[1, 3], DType::F32);
    assert_eq!(
        err(one.batch_norm(None, None, None, None, true, 0.1, 1e-5)),
        "Expected more than 1 value per channel when training, got input size [1, 3]"
    );
    let w2 = Tensor::ones(&[2], DType::F32);
    assert_eq!(
        err(x.batch_norm(None, None, Some(&w2), None, true, 0.1, 1e-5)),
        "weight should contain 3 elements not 2"
    );
}

#[test]
fn dropout_masks_depend_only_on_the_seed() {
    let x = Tensor::ones(&[64, 50], DType::F32);
    let a = x.dropout_seeded(0.3, true, 42).unwrap();
    let b = x.dropout_seeded(0.3, true, 42).unwrap();
    assert_eq!(a.to_f64_vec(), b.to_f64_vec());
    let c = x.dropout_seeded(0.3, true, 43).unwrap();
    assert_ne!(a.to_f64_vec(), c.to_f64_vec());
    let vals = a.to_f64_vec();
    let scale = (1.0f32 / 0.7) as f64;
    assert!(vals.iter().all(|&v| v == 0.0 || (v - scale).abs() < 1e-6));
    let kept = vals.iter().filter(|&&v| v != 0.0).count() as f64 / vals.len() as f64;
    assert!((kept - 0.7).abs() < 0.03, "kept {kept}");
    assert_eq!(
        x.dropout_seeded(0.3, false, 42).unwrap().to_f64_vec(),
        x.to_f64_vec()
    );
    assert!(
        x.dropout_seeded(1.0, true, 1)
            .unwrap()
            .to_f64_vec()
            .iter()
            .all(|&v| v == 0.0)
    );
    assert_eq!(
        err(x.dropout(1.5, true)),
        "dropout probability has to be between 0 and 1, but got 1.5"
    );
    // the gradient is the same mask, scaled
    let t = Tensor::ones(&[10, 10], DType::F64);
    t.requires_grad_(true).unwrap();
    let y = t.dropout_seeded(0.5, true, 7).unwrap();
    y.sum().unwrap().backward().unwrap();
    assert_eq!(t.grad().unwrap().to_f64_vec(), y.to_f64_vec());
    // compiled code draws the same mask as eager mode
    let m = parse_module(
        "graph d(%x: f32[64,50]) {\n  %y: f32[64,50] = dropout(%x, p=0.3, seed=42)\n  return %y\n}\n",
        "d",
    )
    .unwrap();
    let f = CompiledFn::compile(&m.graphs[0], &CompileOptions::default()).unwrap();
    assert_eq!(
        f.call(std::slice::from_ref(&x)).unwrap()[0].to_f64_vec(),
        vals
    );
    // later calls draw fresh masks, as eager steps do from the advancing generator
    let again = f.call(&[x]).unwrap()[0].to_f64_vec();
    assert_ne!(again, vals);
    let kept = again.iter().filter(|&&v| v != 0.0).count() as f64 / again.len() as f64;
    assert!((kept - 0.7).abs() < 0.03, "kept {kept}");
}

#[test]
fn memory_formats_follow_pytorch() {
    let mut g = Generator::new(15);
    let x = rand(&mut g, &[2, 3, 4, 5]);
    assert_eq!(x.suggest_memory_format(), MemoryFormat::Contiguous);
    assert!(x.is_contiguous_format(MemoryFormat::Contiguous));
    assert!(!x.is_contiguous_format(MemoryFormat::ChannelsLast));
    let xl = x.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
    assert_eq!(xl.strides(), &[60, 1, 15, 3]);
    assert_eq!(xl.to_f64_vec(), x.to_f64_vec());
    assert!(xl.is_contiguous_format(MemoryFormat::ChannelsLast));
    assert_eq!(xl.suggest_memory_format(), MemoryFormat::ChannelsLast);
    // already in the format: the same tensor
    let again = xl.contiguous_format(MemoryFormat::ChannelsLast).unwrap();
    assert!(again.shares_storage(&xl));
    let back = xl.contiguous_format(MemoryFormat::Contiguous).unwrap();
    assert!(back.is_contiguous());
    assert_eq!(back.to_f64_vec(), x.to_f64_vec());
    // pointwise ops keep channels_last
    let y = xl.relu().unwrap().add(&xl).unwrap();
    assert_eq!(y.suggest_memory_format(), MemoryFormat::ChannelsLast);
    // one channel: dense in both formats, so `contiguous(memory_format=)` keeps the tensor,
    // and `to(memory_format=)` copies it to PyTorch's channels_last strides
    let one = rand(&mut g, &[2, 1, 3, 3]);
    one.requires_grad_(true).unwrap();
    assert_eq!(one.suggest_memory_format(), MemoryFormat::Contiguous);
    assert!(
        one.contiguous_format(MemoryFormat::ChannelsLast)
            .unwrap()
            .shares_storage(&one)
    );
    let onel = one.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
    assert_eq!(onel.strides(), &[9, 1, 3, 1]);
    assert!(!onel.shares_storage(&one));
    assert_eq!(onel.suggest_memory_format(), MemoryFormat::ChannelsLast);
    assert_eq!(onel.to_f64_vec(), one.to_f64_vec());
    // ... and already there, the same tensor
    assert!(
        onel.to_memory_format(MemoryFormat::ChannelsLast)
            .unwrap()
            .shares_storage(&onel)
    );
    // the copy is recorded: d(sum(3·y))/dx = 3
    onel.mul_scalar(3.0)
        .unwrap()
        .sum()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(one.grad().unwrap().to_f64_vec(), vec![3.0; 18]);
    // one pixel: [2, 3, 1, 1] becomes [3, 1, 3, 3]
    let pix = rand(&mut g, &[2, 3, 1, 1]);
    let pixl = pix.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
    assert_eq!(pixl.strides(), &[3, 1, 3, 3]);
    assert_eq!(pixl.suggest_memory_format(), MemoryFormat::ChannelsLast);
    assert_eq!(
        err(Tensor::zeros(&[2, 3, 4], DType::F32).to_memory_format(MemoryFormat::ChannelsLast)),
        "required rank 4 tensor to use channels_last format, got a tensor of size [2, 3, 4]"
    );
}

#[test]
fn pooling_norm_and_dropout_graphs_run_on_every_cpu_path() {
    let text = "graph net(%x: f32[4,3,9,8], %m: f32[3], %v: f32[3], %w: f32[3], %b: f32[3]) {
  %n: f32[4,3,9,8] = batch_norm(%x, %m, %v, %w, %b)
  %t: f32[4,3,9,8] = batch_norm(%x, none, none, %w, training=true)
  %s: f32[4,3,9,8] = add(%n, %t)
  %p: f32[4,3,5,4] = max_pool2d(%s, kernel_size=3, stride=2, padding=1)
  %q: f32[4,3,5,4] = avg_pool2d(%s, kernel_size=[3, 4], stride=2, padding=1, ceil_mode=true, count_include_pad=false)
  %a: f32[4,3,5,4] = add(%p, %q)
  %d: f32[4,3,5,4] = dropout(%a, p=0.25, seed=3)
  %r: f32[4,3,2,2] = adaptive_avg_pool2d(%d, output_size=2)
  return %r
}
";
    let m = parse_module(text, "net").unwrap();
    let g = &m.graphs[0];
    assert_eq!(smelt::ir::print_graph(g), text);
    let mut rng = Generator::new(16);
    let inputs: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&v| {
            let t = rand(&mut rng, &g.node(v).ty.shape).abs().unwrap();
            t.to_dtype(DType::F32).unwrap()
        })
        .collect();
    let want = common::inputs::interpret(g, &inputs);
    for fuse in [true, false] {
        let f = CompiledFn::compile(g, &CompileOptions::default().fused(fuse)).unwrap();
        let got = f.call(&inputs).unwrap();
        assert_close(&got[0], &want[0], 1e-4, &format!("fused={fuse}"));
        let mut nhwc = inputs.clone();
        nhwc[0] = inputs[0]
            .to_memory_format(MemoryFormat::ChannelsLast)
            .unwrap();
        // a first call (a second one would draw another dropout mask), planned NHWC
        let opts = CompileOptions::default().fused(fuse).channels_last(&["x"]);
        let f = CompiledFn::compile(g, &opts).unwrap();
        let got = f.call(&nhwc).unwrap();
        assert_close(
            &got[0],
            &want[0],
            1e-4,
            &format!("fused={fuse}, channels_last"),
        );
    }
}

#[test]
fn cnn_layers_train_and_save_their_running_statistics() {
    smelt::manual_seed(0);
    let conv = nn::Conv2d::new(3, 8, [3, 3], ConvOptions::default().padding(1), 1, true).unwrap();
    // kaiming_uniform_(a=√5) over fan_in = 3·3·3: U(-1/√27, 1/√27), for weight and bias
    let bound = 1.0 / 27f64.sqrt();
    let w = conv.weight().to_f64_vec();
    assert!(w.iter().all(|v| v.abs() <= bound) && w.iter().any(|v| v.abs() > bound / 2.0));
    assert_eq!(
        nn::init::calculate_fan_in_and_fan_out(conv.weight()).unwrap(),
        (27, 72)
    );
    let mut bn = nn::BatchNorm2d::new_2d(8).unwrap();
    let x = Tensor::randn(&[4, 3, 6, 6], None).unwrap();
    let h = conv.forward(&x).unwrap();
    let y = bn.forward(&h).unwrap();
    assert_eq!(y.shape(), &[4, 8, 6, 6]);
    // training moved the running statistics and counted the batch
    assert!(bn.running_mean.to_f64_vec().iter().any(|&v| v != 0.0));
    assert_eq!(bn.num_batches_tracked.item::<i64>().unwrap(), 1);
    let names: Vec<String> = nn::state_dict::state_dict(&bn)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "weight",
            "bias",
            "running_mean",
            "running_var",
            "num_batches_tracked"
        ]
    );
    // eval mode uses the running statistics: a batch of one works, and repeats exactly
    bn.eval();
    let x1 = h.narrow(0, 0, 1).unwrap();
    let a = bn.forward(&x1).unwrap();
    let b = bn.forward(&x1).unwrap();
    assert_eq!(a.to_f64_vec(), b.to_f64_vec());
    // the running statistics survive a safetensors round trip
    let bytes = nn::state_dict::to_safetensors_bytes(&nn::state_dict::state_dict(&bn)).unwrap();
    let fresh = nn::BatchNorm2d::new_2d(8).unwrap();
    let loaded = nn::state_dict::from_safetensors_bytes(&bytes).unwrap();
    nn::state_dict::load_state_dict(&fresh, &loaded, true).unwrap();
    assert_eq!(fresh.running_var.to_f64_vec(), bn.running_var.to_f64_vec());
    assert_eq!(
        err(bn.forward(&Tensor::zeros(&[2, 8, 3], DType::F32))),
        "expected 4D input (got 3D input)"
    );
    // a small CNN trains: the loss falls
    let model = nn::Sequential::new()
        .add(nn::Conv2d::new(1, 4, [3, 3], ConvOptions::default().padding(1), 1, true).unwrap())
        .add(nn::BatchNorm2d::new_2d(4).unwrap())
        .add(nn::ReLU::new())
        .add(nn::MaxPool2d::new(PoolOptions::new(2)))
        .add(nn::AdaptiveAvgPool2d::new([1, 1]))
        .add(nn::Flatten::default())
        .add(nn::Linear::new(4, 2, true).unwrap());
    assert_eq!(
        nn::state_dict::state_dict(&model).len(),
        2 + 5 + 2,
        "conv, batch norm (with buffers), linear"
    );
    let mut opt =
        smelt::optim::SGD::new(model.parameters(), smelt::optim::SGDConfig::new(0.1)).unwrap();
    let mut rng = Generator::new(17);
    let xb = Tensor::randn_with(&[16, 1, 8, 8], None, &mut rng).unwrap();
    let labels: Vec<i64> = (0..16).map(|i| (i % 2) as i64).collect();
    // class 1 images are brighter
    let shift = Tensor::from_vec(
        labels.iter().map(|&l| l as f32 * 1.5).collect::<Vec<_>>(),
        &[16, 1, 1, 1],
    )
    .unwrap();
    let xb = xb.add(&shift).unwrap();
    let t = Tensor::from_vec(labels, &[16]).unwrap();
    let loss_of = |m: &nn::Sequential| {
        let out = m.forward(&xb).unwrap();
        nn::functional::cross_entropy(&out, &t).unwrap()
    };
    let first = loss_of(&model).item::<f32>().unwrap();
    for _ in 0..30 {
        opt.zero_grad();
        loss_of(&model).backward().unwrap();
        opt.step().unwrap();
    }
    let last = loss_of(&model).item::<f32>().unwrap();
    assert!(last < first * 0.5, "loss {first} -> {last}");
}

/// Random f32 inputs of graph `g`, from `seed`.
fn f32_inputs(g: &smelt::ir::graph::Graph, seed: u64) -> Vec<Tensor> {
    let mut rng = Generator::new(seed);
    g.inputs()
        .iter()
        .map(|&v| {
            rand(&mut rng, &g.node(v).ty.shape)
                .to_dtype(DType::F32)
                .unwrap()
        })
        .collect()
}

#[test]
fn a_global_pool_gradient_fuses_into_its_readers() {
    // adaptive_avg_pool2d_backward to 1×1 is a broadcast divided by H·W: no kernel of
    // its own; other output sizes keep the pooling kernel. Values as the interpreter's.
    for (out, extern_left) in [(1, false), (2, true)] {
        let text = format!(
            "graph g(%g: f32[3,5,{out},{out}], %x: f32[3,5,4,6]) {{
  %d: f32[3,5,4,6] = adaptive_avg_pool2d_backward(%g, input_size=[3, 5, 4, 6])
  %y: f32[3,5,4,6] = mul(%d, %x)
  return %y
}}
"
        );
        let m = parse_module(&text, "g").unwrap();
        let g = &m.graphs[0];
        let inputs = f32_inputs(g, 4);
        let want = common::inputs::interpret(g, &inputs);
        let f = CompiledFn::compile(g, &CompileOptions::default()).unwrap();
        let s = f.schedule();
        assert_eq!(s.externs().count() == 1, extern_left, "{s}");
        assert_close(
            &f.call(&inputs).unwrap()[0],
            &want[0],
            0.0,
            "global pool gradient",
        );
        // [3, 5, 1, 1] · x: 1/(H·W) exactly as the kernel's division
        if out == 1 {
            let gv = inputs[0].to_f64_vec();
            let xv = inputs[1].to_f64_vec();
            let got = want[0].to_f64_vec();
            for (i, (&y, &x)) in got.iter().zip(&xv).enumerate() {
                let d = f64::from(gv[i / 24] as f32 / 24.0);
                assert_eq!(y, f64::from((d * x) as f32), "element {i}");
            }
        }
    }
}

#[test]
fn nhwc_and_row_major_values_of_equal_sizes_get_their_own_kernels() {
    // With C = H = W, x in NHWC and its permute [N, H, W, C] (row-major) have equal shapes;
    // one kernel storing both would write one of them across its rows.
    let text = "graph g(%x: f32[2,4,4,4]) {
  %a: f32[2,4,4,4] = relu(%x)
  %p: f32[2,4,4,4] = permute(%x, dims=[0, 2, 3, 1])
  %b: f32[2,4,4,4] = neg(%p)
  return %a, %b
}
";
    let m = parse_module(text, "g").unwrap();
    let g = &m.graphs[0];
    let x = rand(&mut Generator::new(5), &[2, 4, 4, 4])
        .to_dtype(DType::F32)
        .unwrap();
    let want = common::inputs::interpret(g, std::slice::from_ref(&x));
    let f = CompiledFn::compile(g, &CompileOptions::default().channels_last(&["x"])).unwrap();
    let s = f.schedule();
    // each kernel stores buffers of one layout
    for k in s.kernels() {
        let layouts: std::collections::HashSet<bool> = k
            .stores
            .iter()
            .map(|st| s.buffers[st.buffer].channels_last)
            .collect();
        assert_eq!(layouts.len(), 1, "{s}");
    }
    let xl = x.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
    let got = f.call(&[xl]).unwrap();
    assert_close(&got[0], &want[0], 0.0, "relu");
    assert_close(&got[1], &want[1], 0.0, "neg of the permute");
    assert_eq!(got[0].suggest_memory_format(), MemoryFormat::ChannelsLast);
}

#[test]
fn per_channel_sums_of_nhwc_values_store_no_products() {
    // Batch norm's gradient sums products such as g·x̂ over (N, H, W) per channel. Over a
    // channels_last value they are taken per image, then across images, through a permute
    // only, so the product is computed inside the reduction: no [N, H, W, C] buffer holds
    // it. Values as the interpreter's.
    let text = "graph g(%x: f32[4,6,5,3], %y: f32[4,6,5,3], %m: f32[1,6,1,1]) {
  %c: f32[4,6,5,3] = sub(%x, %m)
  %p: f32[4,6,5,3] = mul(%c, %y)
  %s: f32[6] = sum(%p, dim=[0, 2, 3])
  %t: f32[1,6,1,1] = mean(%c, dim=[0, 2, 3], keepdim=true)
  return %s, %t
}
";
    let m = parse_module(text, "g").unwrap();
    let g = &m.graphs[0];
    let inputs = f32_inputs(g, 9);
    let want = common::inputs::interpret(g, &inputs);
    let opts = CompileOptions::default().channels_last(&["x", "y"]);
    let f = CompiledFn::compile(g, &opts).unwrap();
    let s = f.schedule();
    let full = s
        .buffers
        .iter()
        .filter(|b| b.shape.iter().product::<usize>() == 360)
        .count();
    assert_eq!(full, 2, "only the inputs are full size\n{s}");
    let nhwc: Vec<Tensor> = inputs
        .iter()
        .map(|t| match t.dim() {
            4 if t.shape()[1] == 6 && t.shape()[2] == 5 => {
                t.to_memory_format(MemoryFormat::ChannelsLast).unwrap()
            }
            _ => t.clone(),
        })
        .collect();
    let got = f.call(&nhwc).unwrap();
    assert_close(&got[0], &want[0], 1e-5, "sum of products");
    assert_close(&got[1], &want[1], 1e-5, "mean");
}
