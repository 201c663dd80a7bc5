//! `conv1d`/`conv2d` against a float64 convolution written out here (one multiply-add per
//! tap, no shared index math with the kernels), over strides, paddings (`"same"` with even
//! kernels is asymmetric), dilations, groups up to depthwise, unbatched and empty inputs,
//! channels_last and strided views; gradients against finite differences (`gradcheck`);
//! eager, interpreted and compiled (fused and unfused) runs; PyTorch's error messages.

mod common;

use common::close::assert_close;
use smelt::autograd::gradcheck;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::parse_module;
use smelt::runtime::interp;
use smelt::runtime::{ConvOptions, MemoryFormat};
use smelt::{DType, Generator, Tensor};

/// One convolution configuration: x [n, c, h, w], weight [o, c / g, kh, kw].
#[derive(Clone, Debug)]
struct Case {
    n: usize,
    c: usize,
    o: usize,
    hw: [usize; 2],
    k: [usize; 2],
    stride: [usize; 2],
    /// (before, after) per dim
    pad: [(usize, usize); 2],
    dil: [usize; 2],
    groups: usize,
    bias: bool,
}

/// The convolution in f64 on row-major data.
fn reference(cs: &Case, x: &[f64], w: &[f64], b: Option<&[f64]>) -> (Vec<f64>, [usize; 2]) {
    let out: Vec<usize> = (0..2)
        .map(|i| {
            (cs.hw[i] + cs.pad[i].0 + cs.pad[i].1 - cs.dil[i] * (cs.k[i] - 1) - 1) / cs.stride[i]
                + 1
        })
        .collect();
    let (oh, ow) = (out[0], out[1]);
    let (cg, og) = (cs.c / cs.groups, cs.o / cs.groups);
    let mut y = vec![0.0; cs.n * cs.o * oh * ow];
    for n in 0..cs.n {
        for o in 0..cs.o {
            let g = o / og;
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b[o]);
                    for ci in 0..cg {
                        let c = g * cg + ci;
                        for p in 0..cs.k[0] {
                            for q in 0..cs.k[1] {
                                let r = (i * cs.stride[0] + p * cs.dil[0]) as isize
                                    - cs.pad[0].0 as isize;
                                let s = (j * cs.stride[1] + q * cs.dil[1]) as isize
                                    - cs.pad[1].0 as isize;
                                if r < 0
                                    || s < 0
                                    || r >= cs.hw[0] as isize
                                    || s >= cs.hw[1] as isize
                                {
                                    continue;
                                }
                                let xv = x[((n * cs.c + c) * cs.hw[0] + r as usize) * cs.hw[1]
                                    + s as usize];
                                let wv = w[((o * cg + ci) * cs.k[0] + p) * cs.k[1] + q];
                                acc += xv * wv;
                            }
                        }
                    }
                    y[((n * cs.o + o) * oh + i) * ow + j] = acc;
                }
            }
        }
    }
    (y, [oh, ow])
}

fn rand(g: &mut Generator, shape: &[usize], dtype: DType) -> Tensor {
    Tensor::randn_with(shape, Some(dtype), g).unwrap()
}

fn options(cs: &Case) -> ConvOptions {
    let symmetric = cs.pad.iter().all(|(a, b)| a == b);
    let o = ConvOptions::default()
        .stride([cs.stride[0] as i64, cs.stride[1] as i64])
        .dilation([cs.dil[0] as i64, cs.dil[1] as i64])
        .groups(cs.groups as i64);
    if symmetric {
        o.padding([cs.pad[0].0 as i64, cs.pad[1].0 as i64])
    } else {
        o.padding_same()
    }
}

fn cases() -> Vec<Case> {
    let base = Case {
        n: 2,
        c: 3,
        o: 4,
        hw: [7, 6],
        k: [3, 3],
        stride: [1, 1],
        pad: [(0, 0), (0, 0)],
        dil: [1, 1],
        groups: 1,
        bias: true,
    };
    vec![
        base.clone(),
        Case {
            pad: [(1, 1), (2, 2)],
            stride: [2, 3],
            ..base.clone()
        },
        Case {
            dil: [2, 1],
            pad: [(2, 2), (1, 1)],
            bias: false,
            ..base.clone()
        },
        // "same" with an even kernel: one more zero after than before
        Case {
            k: [4, 2],
            pad: [(1, 2), (0, 1)],
            ..base.clone()
        },
        Case {
            c: 4,
            o: 6,
            groups: 2,
            k: [1, 3],
            pad: [(0, 0), (1, 1)],
            ..base.clone()
        },
        // depthwise
        Case {
            c: 5,
            o: 5,
            groups: 5,
            hw: [9, 8],
            pad: [(1, 1), (1, 1)],
            stride: [2, 2],
            ..base.clone()
        },
        // 1x1, and the kernel as large as the padded input
        Case {
            k: [1, 1],
            c: 8,
            o: 3,
            ..base.clone()
        },
        Case {
            k: [5, 4],
            hw: [3, 2],
            pad: [(1, 1), (1, 1)],
            ..base.clone()
        },
        Case {
            n: 1,
            c: 16,
            o: 24,
            hw: [13, 11],
            k: [3, 3],
            pad: [(1, 1), (1, 1)],
            ..base.clone()
        },
    ]
}

fn run_case(cs: &Case, dtype: DType, tol: f64, g: &mut Generator) {
    let x = rand(g, &[cs.n, cs.c, cs.hw[0], cs.hw[1]], dtype);
    let w = rand(g, &[cs.o, cs.c / cs.groups, cs.k[0], cs.k[1]], dtype);
    let b = rand(g, &[cs.o], dtype);
    let bias = cs.bias.then_some(&b);
    let (want, [oh, ow]) = reference(
        cs,
        &x.to_f64_vec(),
        &w.to_f64_vec(),
        bias.map(|b| b.to_f64_vec()).as_deref(),
    );
    let y = x.conv2d(&w, bias, &options(cs)).unwrap();
    assert_eq!(y.shape(), &[cs.n, cs.o, oh, ow], "{cs:?}");
    assert_close(&y.to_f64_vec(), &want, tol, &format!("{cs:?} {dtype}"));
    // the same values from a channels_last input, laid out channels_last
    let xl = x.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
    let yl = xl.conv2d(&w, bias, &options(cs)).unwrap();
    assert_close(
        &yl.to_f64_vec(),
        &want,
        tol,
        &format!("{cs:?} channels_last"),
    );
    if oh * ow > 1 && cs.o > 1 {
        assert_eq!(
            yl.suggest_memory_format(),
            MemoryFormat::ChannelsLast,
            "{cs:?}"
        );
    }
}

#[test]
fn conv2d_matches_float64_convolution() {
    let mut g = Generator::new(1);
    for cs in cases() {
        run_case(&cs, DType::F64, 1e-12, &mut g);
        run_case(&cs, DType::F32, 1e-5, &mut g);
    }
}

/// The f32 path keeps reordered weights between calls: an in-place update of the weights,
/// or another view of the same storage, must still be what the next call uses.
#[test]
fn conv2d_sees_weight_updates_between_calls() {
    let mut g = Generator::new(5);
    let cs = Case {
        n: 1,
        c: 8,
        o: 16,
        hw: [5, 5],
        k: [3, 3],
        stride: [1, 1],
        pad: [(1, 1), (1, 1)],
        dil: [1, 1],
        groups: 1,
        bias: false,
    };
    let x = rand(&mut g, &[1, 8, 5, 5], DType::F32);
    let both = rand(&mut g, &[32, 8, 3, 3], DType::F32);
    let w = both.narrow(0, 0, 16).unwrap();
    let check = |w: &Tensor, what: &str| {
        let (want, _) = reference(&cs, &x.to_f64_vec(), &w.to_f64_vec(), None);
        let y = x.conv2d(w, None, &options(&cs)).unwrap();
        assert_close(&y.to_f64_vec(), &want, 1e-5, what);
    };
    check(&w, "first call");
    check(&w, "the same weights again");
    w.add_scalar_(0.5).unwrap();
    check(&w, "after an in-place update");
    check(
        &both.narrow(0, 16, 16).unwrap(),
        "another view of the same storage",
    );
}

#[test]
fn conv2d_reads_strided_views() {
    let mut g = Generator::new(2);
    let cs = Case {
        n: 2,
        c: 3,
        o: 4,
        hw: [6, 5],
        k: [3, 2],
        stride: [1, 2],
        pad: [(1, 1), (1, 1)],
        dil: [1, 1],
        groups: 1,
        bias: true,
    };
    // x as a transposed view of [n, c, w, h], w as a slice of a wider tensor
    let xt = rand(&mut g, &[2, 3, 5, 6], DType::F64);
    let x = xt.transpose(2, 3).unwrap();
    let wide = rand(&mut g, &[4, 3, 3, 5], DType::F64);
    let w = wide.narrow(3, 1, 2).unwrap();
    let b = rand(&mut g, &[4], DType::F64);
    let (want, _) = reference(&cs, &x.to_f64_vec(), &w.to_f64_vec(), Some(&b.to_f64_vec()));
    let y = x.conv2d(&w, Some(&b), &options(&cs)).unwrap();
    assert_close(&y.to_f64_vec(), &want, 1e-12, "strided views");
}

#[test]
fn conv1d_unbatched_and_empty_inputs() {
    let mut g = Generator::new(3);
    // conv1d is conv2d with a height of 1
    let x = rand(&mut g, &[2, 4, 9], DType::F64);
    let w = rand(&mut g, &[6, 2, 3], DType::F64);
    let b = rand(&mut g, &[6], DType::F64);
    let o = ConvOptions::default()
        .stride(2)
        .padding(2)
        .dilation(2)
        .groups(2);
    let y = x.conv1d(&w, Some(&b), &o).unwrap();
    let cs = Case {
        n: 2,
        c: 4,
        o: 6,
        hw: [1, 9],
        k: [1, 3],
        stride: [1, 2],
        pad: [(0, 0), (2, 2)],
        dil: [1, 2],
        groups: 2,
        bias: true,
    };
    let (want, [_, ow]) = reference(&cs, &x.to_f64_vec(), &w.to_f64_vec(), Some(&b.to_f64_vec()));
    assert_eq!(y.shape(), &[2, 6, ow]);
    assert_close(&y.to_f64_vec(), &want, 1e-12, "conv1d");
    // unbatched: [C, L] in, [C_out, L_out] out, the batch's first row
    let y0 = x.select(0, 0).unwrap().conv1d(&w, Some(&b), &o).unwrap();
    assert_eq!(y0.shape(), &[6, ow]);
    assert_close(&y0.to_f64_vec(), &want[..6 * ow], 1e-12, "unbatched conv1d");
    // an empty batch
    let e = Tensor::zeros(&[0, 4, 9], DType::F64);
    let ye = e.conv1d(&w, Some(&b), &o).unwrap();
    assert_eq!(ye.shape(), &[0, 6, ow]);
    let x2 = Tensor::zeros(&[0, 3, 5, 5], DType::F32);
    let w2 = Tensor::ones(&[2, 3, 3, 3], DType::F32);
    assert_eq!(
        x2.conv2d(&w2, None, &ConvOptions::default())
            .unwrap()
            .shape(),
        &[0, 2, 3, 3]
    );
}

#[test]
fn conv_gradients_match_finite_differences() {
    let mut g = Generator::new(4);
    for cs in [
        Case {
            n: 2,
            c: 2,
            o: 3,
            hw: [5, 4],
            k: [3, 2],
            stride: [2, 1],
            pad: [(1, 1), (1, 1)],
            dil: [1, 2],
            groups: 1,
            bias: true,
        },
        Case {
            n: 1,
            c: 4,
            o: 4,
            hw: [4, 5],
            k: [2, 3],
            stride: [1, 1],
            pad: [(0, 1), (1, 1)],
            dil: [1, 1],
            groups: 2,
            bias: false,
        },
        Case {
            n: 2,
            c: 3,
            o: 3,
            hw: [5, 5],
            k: [3, 3],
            stride: [2, 2],
            pad: [(1, 1), (1, 1)],
            dil: [1, 1],
            groups: 3,
            bias: true,
        },
    ] {
        let x = rand(&mut g, &[cs.n, cs.c, cs.hw[0], cs.hw[1]], DType::F64);
        let w = rand(
            &mut g,
            &[cs.o, cs.c / cs.groups, cs.k[0], cs.k[1]],
            DType::F64,
        );
        let b = rand(&mut g, &[cs.o], DType::F64);
        let o = options(&cs);
        let has_bias = cs.bias;
        let r = gradcheck(
            |t| {
                let bias = has_bias.then_some(&t[2]);
                t[0].conv2d(&t[1], bias, &o)
            },
            &[
                x.requires_grad_(true).unwrap().clone(),
                w.requires_grad_(true).unwrap().clone(),
                b.requires_grad_(true).unwrap().clone(),
            ],
        );
        assert!(r.is_ok(), "{cs:?}: {r:?}");
        // the same gradients through channels_last (gradcheck makes its own contiguous
        // leaves, so compare the two layouts' backward passes directly)
        let grads = |x: &Tensor| {
            let (x, w) = (x.detach(), w.detach());
            x.requires_grad_(true).unwrap();
            w.requires_grad_(true).unwrap();
            let gy = Tensor::randn_with(&[1], Some(DType::F64), &mut Generator::new(9)).unwrap();
            let y = x.conv2d(&w, None, &o).unwrap();
            y.mul(&gy).unwrap().sum().unwrap().backward().unwrap();
            (x.grad().unwrap(), w.grad().unwrap())
        };
        let (gx, gw) = grads(&x);
        let (gxl, gwl) = grads(&x.to_memory_format(MemoryFormat::ChannelsLast).unwrap());
        assert_close(&gxl, &gx, 1e-12, "channels_last input gradient");
        assert_close(&gwl, &gw, 1e-12, "channels_last weight gradient");
    }
    // conv1d, unbatched
    let x = rand(&mut g, &[3, 7], DType::F64);
    let w = rand(&mut g, &[2, 3, 3], DType::F64);
    let o = ConvOptions::default().padding_same();
    let r = gradcheck(
        |t| t[0].conv1d(&t[1], None, &o),
        &[
            x.requires_grad_(true).unwrap().clone(),
            w.requires_grad_(true).unwrap().clone(),
        ],
    );
    assert!(r.is_ok(), "conv1d: {r:?}");
}

fn err(r: smelt::Result<Tensor>) -> String {
    r.err().map(|e| e.to_string()).unwrap_or_default()
}

#[test]
fn bad_convolutions_give_pytorchs_messages() {
    let w = Tensor::zeros(&[8, 3, 3, 3], DType::F32);
    let x = |s: &[usize]| Tensor::zeros(s, DType::F32);
    let d = ConvOptions::default();
    assert_eq!(
        err(x(&[2, 3]).conv2d(&w, None, &d)),
        "Expected 3D (unbatched) or 4D (batched) input to conv2d, but got input of size: [2, 3]"
    );
    assert_eq!(
        err(x(&[2, 4, 5, 5]).conv2d(&w, None, &d)),
        "Given groups=1, weight of size [8, 3, 3, 3], expected input[2, 4, 5, 5] to have 3 channels, but got 4 channels instead"
    );
    assert_eq!(
        err(x(&[2, 4, 5, 5]).conv2d(&x(&[3, 2, 3, 3]), None, &d.clone().groups(2))),
        "Given groups=2, expected weight to be divisible by 2 at dimension 0, but got weight of size [[3, 2, 3, 3]] instead"
    );
    assert_eq!(
        err(x(&[2, 3, 5, 5]).conv2d(&w, None, &d.clone().padding(-1))),
        "negative padding is not supported"
    );
    assert_eq!(
        err(x(&[2, 3, 2, 2]).conv2d(&w, None, &d)),
        "Calculated padded input size per channel: (2 x 2). Kernel size: (3 x 3). Kernel size can't be greater than actual input size"
    );
    assert_eq!(
        err(x(&[2, 3, 5, 5]).conv2d(&w, None, &d.clone().stride(0))),
        "non-positive stride is not supported"
    );
    assert_eq!(
        err(x(&[2, 3, 5, 5]).conv2d(&w, Some(&x(&[4])), &d)),
        "Given weight of size [8, 3, 3, 3], expected bias to be 1-dimensional with 8 elements, but got bias of size [4] instead"
    );
    assert_eq!(
        err(x(&[2, 3, 5, 5]).conv2d(&w, None, &d.clone().padding_same().stride(2))),
        "padding='same' is not supported for strided convolutions"
    );
    assert_eq!(
        err(x(&[2, 3, 5, 5]).conv2d(&w, None, &d.clone().groups(0))),
        "non-positive groups is not supported"
    );
    assert_eq!(
        err(x(&[2, 3, 5, 5])
            .to_dtype(DType::F64)
            .unwrap()
            .conv2d(&w, None, &d)),
        "expected scalar type Double but found Float"
    );
    assert_eq!(
        err(x(&[2, 3, 5, 5]).conv2d(&w, None, &d.clone().stride([1, 1, 1]))),
        "expected stride to be a single integer value or a list of 2 values to match the convolution dimensions, but got stride=[1, 1, 1]"
    );
    assert_eq!(
        err(x(&[2, 3, 5, 5]).conv1d(&x(&[8, 3, 3]), None, &d)),
        "Expected 2D (unbatched) or 3D (batched) input to conv1d, but got input of size: [2, 3, 5, 5]"
    );
}

/// The text form, interpreted, compiled fused and unfused, agree; the gradient graph of a
/// convolution (`smelt grad`'s) runs too.
#[test]
fn conv_graphs_run_on_every_cpu_path() {
    let text = "graph net(%x: f32[2,3,9,8], %w: f32[4,3,3,3], %b: f32[4], %w2: f32[4,1,3,3]) {
  %y: f32[2,4,5,4] = conv2d(%x, %w, %b, stride=2, padding=1)
  %r: f32[2,4,5,4] = relu(%y)
  %z: f32[2,4,5,4] = conv2d(%r, %w2, padding=\"same\", groups=4)
  %s: f32[2,4,5,4] = add(%z, %y)
  return %s
}
";
    let m = parse_module(text, "net").unwrap();
    let g = &m.graphs[0];
    assert_eq!(smelt::ir::print_graph(g), text);
    let mut rng = Generator::new(5);
    let inputs: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&v| rand(&mut rng, &g.node(v).ty.shape, DType::F32))
        .collect();
    let want = common::inputs::interpret(g, &inputs);
    for fuse in [true, false] {
        let f = CompiledFn::compile(g, &CompileOptions::default().fused(fuse)).unwrap();
        let got = f.call(&inputs).unwrap();
        assert_close(&got[0], &want[0], 1e-5, &format!("fused={fuse}"));
        // channels_last inputs are read through their strides
        let mut nhwc = inputs.clone();
        nhwc[0] = inputs[0]
            .to_memory_format(MemoryFormat::ChannelsLast)
            .unwrap();
        let got = f.call(&nhwc).unwrap();
        assert_close(
            &got[0],
            &want[0],
            1e-5,
            &format!("fused={fuse}, channels_last"),
        );
    }
}

/// A ResNet-style block traced for inference: conv → batch_norm (eval, constants) → relu,
/// then a second conv and a residual add.
fn inference_block() -> (smelt::ir::Graph, Tensor) {
    let mut g = Generator::new(21);
    let conv = |g: &mut Generator, c: usize| rand(g, &[c, c, 3, 3], DType::F32);
    let stats = |g: &mut Generator| {
        (
            rand(g, &[8], DType::F32),
            rand(g, &[8], DType::F32).abs().unwrap(),
            rand(g, &[8], DType::F32),
            rand(g, &[8], DType::F32),
        )
    };
    let (w1, w2) = (conv(&mut g, 8), conv(&mut g, 8));
    let (m1, v1, s1, b1) = stats(&mut g);
    let (m2, v2, s2, b2) = stats(&mut g);
    let x = rand(&mut g, &[2, 8, 10, 9], DType::F32);
    let o = ConvOptions::default().padding(1);
    let traced = smelt::jit::trace(
        move |xs: &[Tensor]| {
            let h = xs[0].conv2d(&w1, None, &o)?;
            let h = h.batch_norm(Some(&m1), Some(&v1), Some(&s1), Some(&b1), false, 0.1, 1e-5)?;
            let h = h.relu()?;
            let h = h.conv2d(&w2, None, &o)?;
            let h = h.batch_norm(Some(&m2), Some(&v2), Some(&s2), Some(&b2), false, 0.1, 1e-5)?;
            Ok(vec![h.add(&xs[0])?.relu()?])
        },
        std::slice::from_ref(&x),
    )
    .unwrap();
    (traced.graph().clone(), x)
}

#[test]
fn eval_batch_norm_folds_into_the_convolution() {
    let (g, x) = inference_block();
    let want = interp::run(&g, &[("x0", x.clone())]).unwrap();
    let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
    // each conv-bn(-relu) is one convolution step plus at most one kernel: the batch norms
    // became the convolutions' weights and biases
    let s = f.schedule();
    assert_eq!(s.externs().filter(|e| e.op.name() == "conv2d").count(), 2);
    assert_eq!(s.externs().count(), 2, "{s}");
    assert!(s.kernel_count() <= 2, "{s}");
    let got = f.call(std::slice::from_ref(&x)).unwrap();
    assert_close(&got[0], &want[0], 1e-4, "folded");
    // unfused: nothing folded, the same values
    let u = CompiledFn::compile(&g, &CompileOptions::default().fused(false)).unwrap();
    assert!(u.schedule().kernel_count() > s.kernel_count());
    assert_close(&u.call(&[x]).unwrap()[0], &want[0], 1e-4, "unfused");
}

/// The gradients of a bias-free convolution of `x` by `w`, given `gy`, by eager backward.
fn conv_grads(x: &Tensor, w: &Tensor, gy: &Tensor) -> (Tensor, Tensor) {
    x.set_grad(None);
    w.set_grad(None);
    let y = x
        .conv2d(w, None, &ConvOptions::default().padding(1))
        .unwrap();
    y.backward_with(gy).unwrap();
    (x.grad().unwrap(), w.grad().unwrap())
}

#[test]
fn hot_backward_plans_keep_channels_last() {
    // Eager backward compiles a structure it has seen often; the compiled plan must keep
    // channels_last gradients channels_last (as the op-by-op sweep and PyTorch do), and the
    // same structure in NCHW afterwards must get NCHW gradients of the same values.
    let mut g = Generator::new(3);
    let x = rand(&mut g, &[2, 3, 5, 6], DType::F32);
    let w = rand(&mut g, &[4, 3, 3, 3], DType::F32);
    let gy = rand(&mut g, &[2, 4, 5, 6], DType::F32);
    w.requires_grad_(true).unwrap();
    let xl = x
        .to_memory_format(MemoryFormat::ChannelsLast)
        .unwrap()
        .detach();
    xl.requires_grad_(true).unwrap();
    x.requires_grad_(true).unwrap();
    let gyl = gy.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
    let (want_x, want_w) = conv_grads(&x, &w, &gy);
    for fmt in ["nchw", "channels_last", "nchw"] {
        for step in 0..14 {
            let (gx, gw) = if fmt == "nchw" {
                conv_grads(&x, &w, &gy)
            } else {
                conv_grads(&xl, &w, &gyl)
            };
            let want_fmt = if fmt == "nchw" {
                MemoryFormat::Contiguous
            } else {
                MemoryFormat::ChannelsLast
            };
            assert_eq!(gx.suggest_memory_format(), want_fmt, "{fmt} step {step}");
            assert_close(&gx, &want_x, 1e-5, "input gradient");
            assert_close(&gw, &want_w, 1e-5, "weight gradient");
        }
    }
}

#[test]
fn compiled_functions_keep_channels_last_inputs_nhwc() {
    let (g, x) = inference_block();
    let want = interp::run(&g, &[("x0", x.clone())]).unwrap();
    let f = CompiledFn::compile(&g, &CompileOptions::default().channels_last(&["x0"])).unwrap();
    let s = f.schedule();
    // every 4-D buffer the block computes is NHWC
    for e in s.externs() {
        assert!(s.buffers[e.out].channels_last, "{s}");
    }
    let xl = x.to_memory_format(MemoryFormat::ChannelsLast).unwrap();
    let got = f.call(std::slice::from_ref(&xl)).unwrap();
    assert_close(&got[0], &want[0], 1e-4, "channels_last");
    assert_eq!(got[0].suggest_memory_format(), MemoryFormat::ChannelsLast);
    // an unknown name is an error, not silently ignored
    let e = CompiledFn::compile(&g, &CompileOptions::default().channels_last(&["y"]));
    assert!(
        e.err()
            .is_some_and(|e| e.to_string().contains("has no input named 'y'")),
    );
    // a contiguous input is converted, with the same result
    let got = f.call(std::slice::from_ref(&x)).unwrap();
    assert_close(&got[0], &want[0], 1e-4, "contiguous input");
    // fused and unfused agree in NHWC as well
    let u = CompiledFn::compile(
        &g,
        &CompileOptions::default()
            .fused(false)
            .channels_last(&["x0"]),
    )
    .unwrap();
    assert_close(&u.call(&[xl]).unwrap()[0], &want[0], 1e-4, "unfused NHWC");
}

#[test]
fn smelt_check_reports_a_conv_bn_relu_block_and_its_layout() {
    let dir = common::cli::temp_dir("check");
    let m = dir.join("block.smelt");
    std::fs::write(
        &m,
        "graph block(%x: f32[8,16,14,14], %w: f32[16,16,3,3], %m: f32[16], %v: f32[16], %g: f32[16], %b: f32[16]) {
  %c: f32[8,16,14,14] = conv2d(%x, %w, none, padding=1)
  %n: f32[8,16,14,14] = batch_norm(%c, %m, %v, %g, %b)
  %r: f32[8,16,14,14] = relu(%n)
  return %r
}
",
    )
    .unwrap();
    let m = m.to_str().unwrap();
    let o = common::cli::smelt(&["check", m, "--fusion"]);
    let out = common::cli::stdout(&o);
    assert!(o.status.success(), "{}", common::cli::stderr(&o));
    assert!(
        out.starts_with("graph block: 1 kernel, 1 extern call"),
        "{out}"
    );
    assert!(out.contains("extern 0 conv2d("), "{out}");
    assert!(!out.contains("layout:"), "{out}");
    let o = common::cli::smelt(&["check", m, "--fusion", "--channels-last", "x"]);
    let out = common::cli::stdout(&o);
    assert!(
        out.starts_with("graph block: 1 kernel, 1 extern call"),
        "{out}"
    );
    assert!(
        out.contains("layout: channels_last (NHWC) %x, %c, %r"),
        "{out}"
    );
    assert!(out.contains("conv2d(b0 %x nhwc, b1 %w) -> b"), "{out}");
    assert!(out.contains("%c nhwc"), "{out}");
    // in training mode the batch statistics are passes of the same kernel
    let t = dir.join("train.smelt");
    std::fs::write(
        &t,
        "graph block(%x: f32[8,16,14,14], %w: f32[16,16,3,3], %g: f32[16], %b: f32[16]) {
  %c = conv2d(%x, %w, none, padding=1)
  %n = batch_norm(%c, none, none, %g, %b, training=true)
  %r = relu(%n)
  return %r
}
",
    )
    .unwrap();
    let o = common::cli::smelt(&["check", t.to_str().unwrap(), "--fusion"]);
    let out = common::cli::stdout(&o);
    assert!(
        out.starts_with("graph block: 1 kernel, 1 extern call"),
        "{out}"
    );
    assert!(out.contains("[mean, sub, mul, mean, add, rsqrt"), "{out}");
}
