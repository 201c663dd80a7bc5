use super::*;
use crate::kernels::copy::F64s;
use crate::tensor::threads;
use smelt_rt::conv::{applies, applies_to_input, tile_len, valid_range};

/// Builds an input tensor of a shape and dtype from values in NCHW order.
type Make<'a> = dyn Fn(&[f64], &[usize], DType) -> Tensor + 'a;

/// Deterministic values (xorshift).
struct Rng(u64);

impl Rng {
    fn bits(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// In [-1, 1).
    fn value(&mut self) -> f64 {
        (self.bits() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
    fn values(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.value()).collect()
    }
    /// In 0..n.
    fn below(&mut self, n: usize) -> usize {
        (self.bits() % n as u64) as usize
    }
}

/// One convolution; a 1-d one has `h = kh = 1` and uses only the second entries.
#[derive(Clone, Debug)]
struct Case {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    co: usize,
    kh: usize,
    kw: usize,
    s: [usize; 2],
    pl: [usize; 2],
    ph: [usize; 2],
    dl: [usize; 2],
    g: usize,
    bias: bool,
    one_d: bool,
}

impl Case {
    fn out_hw(&self) -> [usize; 2] {
        let size = |i: usize, k: usize, d: usize| {
            let padded = i + self.pl[d] + self.ph[d];
            let span = self.dl[d] * (k - 1) + 1;
            (padded - span) / self.s[d] + 1
        };
        [size(self.h, self.kh, 0), size(self.w, self.kw, 1)]
    }
    fn geo(&self) -> ConvGeometry {
        let pick = |v: [usize; 2]| if self.one_d { vec![v[1]] } else { v.to_vec() };
        ConvGeometry {
            stride: pick(self.s),
            pad_lo: pick(self.pl),
            pad_hi: pick(self.ph),
            dilation: pick(self.dl),
            groups: self.g,
        }
    }
    fn shape(&self, a: usize, b: usize, h: usize, w: usize) -> Vec<usize> {
        if self.one_d {
            vec![a, b, w]
        } else {
            vec![a, b, h, w]
        }
    }
    fn x_shape(&self) -> Vec<usize> {
        self.shape(self.n, self.c, self.h, self.w)
    }
    fn w_shape(&self) -> Vec<usize> {
        self.shape(self.co, self.c / self.g, self.kh, self.kw)
    }
    fn y_shape(&self) -> Vec<usize> {
        let [oh, ow] = self.out_hw();
        self.shape(self.n, self.co, oh, ow)
    }

    /// Calls `f(x index, w index, y index)` for every product the convolution sums,
    /// all indices into dense NCHW buffers.
    fn visit(&self, mut f: impl FnMut(usize, usize, usize)) {
        let [oh, ow] = self.out_hw();
        let (cig, cog) = (self.c / self.g, self.co / self.g);
        for n in 0..self.n {
            for o in 0..self.co {
                let grp = o / cog;
                for y0 in 0..oh {
                    for x0 in 0..ow {
                        let yi = ((n * self.co + o) * oh + y0) * ow + x0;
                        for ci in 0..cig {
                            for i in 0..self.kh {
                                for j in 0..self.kw {
                                    let r = (y0 * self.s[0] + i * self.dl[0]) as i64
                                        - self.pl[0] as i64;
                                    let q = (x0 * self.s[1] + j * self.dl[1]) as i64
                                        - self.pl[1] as i64;
                                    if r < 0 || q < 0 || r >= self.h as i64 || q >= self.w as i64 {
                                        continue;
                                    }
                                    let c = grp * cig + ci;
                                    let xi = ((n * self.c + c) * self.h + r as usize) * self.w
                                        + q as usize;
                                    let wi = ((o * cig + ci) * self.kh + i) * self.kw + j;
                                    f(xi, wi, yi);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    fn ref_forward(&self, x: &[f64], w: &[f64], b: Option<&[f64]>) -> Vec<f64> {
        let [oh, ow] = self.out_hw();
        let mut y = vec![0.0; self.n * self.co * oh * ow];
        if let Some(b) = b {
            for (i, v) in y.iter_mut().enumerate() {
                *v = b[i / (oh * ow) % self.co];
            }
        }
        self.visit(|xi, wi, yi| y[yi] += x[xi] * w[wi]);
        y
    }
    fn ref_backward_input(&self, gy: &[f64], w: &[f64]) -> Vec<f64> {
        let mut dx = vec![0.0; self.n * self.c * self.h * self.w];
        self.visit(|xi, wi, yi| dx[xi] += gy[yi] * w[wi]);
        dx
    }
    fn ref_backward_weight(&self, gy: &[f64], x: &[f64]) -> Vec<f64> {
        let mut dw = vec![0.0; self.co * (self.c / self.g) * self.kh * self.kw];
        self.visit(|xi, wi, yi| dw[wi] += gy[yi] * x[xi]);
        dw
    }
}

fn random_case(r: &mut Rng, one_d: bool, depthwise: bool) -> Case {
    let (g, cig, cog) = if depthwise {
        (1 + r.below(4), 1, 1)
    } else {
        (1 + r.below(2), 1 + r.below(3), 1 + r.below(3))
    };
    let kh = if one_d { 1 } else { 1 + r.below(4) };
    let kw = 1 + r.below(4);
    let mut k = Case {
        n: 1 + r.below(3),
        c: g * cig,
        h: if one_d { 1 } else { 1 + 2 * r.below(5) },
        w: 1 + 2 * r.below(6),
        co: g * cog,
        kh,
        kw,
        s: [1 + r.below(3), 1 + r.below(3)],
        pl: [r.below(kh / 2 + 1), r.below(kw / 2 + 1)],
        ph: [r.below(kh / 2 + 1), r.below(kw / 2 + 1)],
        dl: [1 + r.below(2), 1 + r.below(2)],
        g,
        bias: r.below(2) == 0,
        one_d,
    };
    if one_d {
        k.s[0] = 1;
        k.pl[0] = 0;
        k.ph[0] = 0;
        k.dl[0] = 1;
    }
    while k.h + k.pl[0] + k.ph[0] < k.dl[0] * (k.kh - 1) + 1 {
        k.h += 1;
    }
    while k.w + k.pl[1] + k.ph[1] < k.dl[1] * (k.kw - 1) + 1 {
        k.w += 1;
    }
    k
}

/// `v` (NCHW order) as a contiguous tensor of `dtype`.
fn tensor(v: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    copy::cast(&Tensor::from_vec(v.to_vec(), shape).unwrap(), dtype).unwrap()
}

/// `v` (NCHW order) as a channels_last tensor of `dtype`.
fn channels_last(v: &[f64], s: &[usize], dtype: DType) -> Tensor {
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let mut t = vec![0.0; v.len()];
    for (i, &x) in v.iter().enumerate() {
        let (ni, ci, hi, wi) = (i / (c * h * w), i / (h * w) % c, i / w % h, i % w);
        t[((ni * h + hi) * w + wi) * c + ci] = x;
    }
    channels_last_view(&tensor(&t, &[n, h, w, c], dtype))
}

/// The values a tensor of `dtype` holds for `v`.
fn rounded(v: &[f64], dtype: DType) -> Vec<f64> {
    tensor(v, &[v.len()], dtype).f64s()
}

fn assert_close(got: &Tensor, want: &[f64], tol: f64, what: &str) {
    let got = got.f64s();
    assert_eq!(got.len(), want.len(), "{what}: element count");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        DType::F32 => 1e-4,
        _ => 2e-2,
    }
}

fn ty(dtype: DType, shape: Vec<usize>) -> TensorType {
    TensorType::new(dtype, shape)
}

/// Forward and both gradients of `k` in `dtype` against the references, the inputs
/// built by `make` (contiguous, channels_last, a view ...).
fn check(k: &Case, dtype: DType, r: &mut Rng, make: &Make) {
    let what = format!("{k:?} {dtype:?}");
    let (xs, ws, ys) = (k.x_shape(), k.w_shape(), k.y_shape());
    let numel = |s: &[usize]| s.iter().product::<usize>();
    let x = rounded(&r.values(numel(&xs)), dtype);
    let w = rounded(&r.values(numel(&ws)), dtype);
    let b = rounded(&r.values(k.co), dtype);
    let gy = rounded(&r.values(numel(&ys)), dtype);
    let (xt, wt, gt) = (
        make(&x, &xs, dtype),
        make(&w, &ws, dtype),
        make(&gy, &ys, dtype),
    );
    let bt = tensor(&b, &[k.co], dtype);
    let bias = k.bias.then_some(&bt);
    let geo = k.geo();
    let y = forward(&xt, &wt, bias, &geo, &ty(dtype, ys.clone())).unwrap();
    assert_eq!(y.dtype(), dtype);
    assert_eq!(y.shape(), ys);
    let want = k.ref_forward(&x, &w, k.bias.then_some(&b[..]));
    assert_close(&y, &want, tol(dtype), &format!("forward {what}"));
    let dx = backward_input(&gt, &wt, &geo, &ty(dtype, xs.clone())).unwrap();
    assert_eq!(dx.shape(), xs);
    let want = k.ref_backward_input(&gy, &w);
    assert_close(&dx, &want, tol(dtype), &format!("backward_input {what}"));
    let dw = backward_weight(&gt, &xt, &geo, &ty(dtype, ws.clone())).unwrap();
    assert_eq!(dw.shape(), ws);
    assert!(dw.is_contiguous());
    let want = k.ref_backward_weight(&gy, &x);
    assert_close(&dw, &want, tol(dtype), &format!("backward_weight {what}"));
}

#[test]
fn matches_the_reference_on_random_2d_and_1d_shapes() {
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for i in 0..60 {
        let k = random_case(&mut r, i % 3 == 2, i % 5 == 4);
        for dtype in [DType::F64, DType::F32] {
            check(&k, dtype, &mut r, &tensor);
        }
    }
    // 1×1, stride 1, unpadded: the input is read directly as the column matrix
    for i in 0..8 {
        let mut k = random_case(&mut r, i % 4 == 3, false);
        (k.kh, k.kw, k.s, k.pl, k.ph) = (1, 1, [1, 1], [0, 0], [0, 0]);
        for dtype in [DType::F64, DType::F32] {
            check(&k, dtype, &mut r, &tensor);
        }
    }
}

#[test]
fn halves_compute_in_f32_and_round_once() {
    let mut r = Rng(7);
    for i in 0..6 {
        let k = random_case(&mut r, i == 5, i == 4);
        for dtype in [DType::F16, DType::BF16] {
            check(&k, dtype, &mut r, &tensor);
        }
    }
}

#[test]
fn the_adjoint_identity_holds() {
    // <conv(x, w), gy> = <x, dL/dx(gy)> = <w, dL/dw(gy, x)>
    let mut r = Rng(11);
    for i in 0..12 {
        let mut k = random_case(&mut r, i % 4 == 3, i % 4 == 2);
        k.bias = false;
        let (xs, ws, ys) = (k.x_shape(), k.w_shape(), k.y_shape());
        let numel = |s: &[usize]| s.iter().product::<usize>();
        let (x, w, gy) = (
            r.values(numel(&xs)),
            r.values(numel(&ws)),
            r.values(numel(&ys)),
        );
        let t = |v: &[f64], s: &[usize]| tensor(v, s, DType::F64);
        let geo = k.geo();
        let y = forward(
            &t(&x, &xs),
            &t(&w, &ws),
            None,
            &geo,
            &ty(DType::F64, ys.clone()),
        );
        let dx = backward_input(&t(&gy, &ys), &t(&w, &ws), &geo, &ty(DType::F64, xs.clone()));
        let dw = backward_weight(&t(&gy, &ys), &t(&x, &xs), &geo, &ty(DType::F64, ws));
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a * b).sum::<f64>();
        let lhs = dot(&y.unwrap().f64s(), &gy);
        let via_x = dot(&x, &dx.unwrap().f64s());
        let via_w = dot(&w, &dw.unwrap().f64s());
        let scale = 1.0 + lhs.abs();
        assert!(
            (lhs - via_x).abs() <= 1e-10 * scale,
            "{k:?}: {lhs} vs {via_x}"
        );
        assert!(
            (lhs - via_w).abs() <= 1e-10 * scale,
            "{k:?}: {lhs} vs {via_w}"
        );
    }
}

#[test]
fn channels_last_inputs_give_channels_last_results() {
    let mut r = Rng(23);
    for i in 0..24 {
        let mut k = random_case(&mut r, false, i % 4 == 3);
        // more than one channel and pixel, so the layouts differ
        if i % 4 == 3 {
            k.g *= 2;
        }
        k.c *= 2;
        k.co *= 2;
        k.h = k.h.max(2);
        k.w = k.w.max(2);
        if i % 4 == 0 {
            // the direct 1×1 path
            (k.kh, k.kw, k.s, k.pl, k.ph) = (1, 1, [1, 1], [0, 0], [0, 0]);
        }
        let dtype = [DType::F64, DType::F32][i % 2];
        check(&k, dtype, &mut r, &|v, s, d| {
            if s.len() == 4 && s[0] == k.n {
                channels_last(v, s, d)
            } else {
                tensor(v, s, d)
            }
        });
        let [oh, ow] = k.out_hw();
        let x = channels_last(&r.values(k.n * k.c * k.h * k.w), &k.x_shape(), dtype);
        let w = tensor(&r.values(k.w_shape().iter().product()), &k.w_shape(), dtype);
        let y = forward(&x, &w, None, &k.geo(), &ty(dtype, k.y_shape())).unwrap();
        assert_eq!(y.strides(), [oh * ow * k.co, 1, ow * k.co, k.co], "{k:?}");
        let gy = channels_last(&r.values(y.numel()), &k.y_shape(), dtype);
        let dx = backward_input(&gy, &w, &k.geo(), &ty(dtype, k.x_shape())).unwrap();
        assert_eq!(dx.strides(), [k.h * k.w * k.c, 1, k.w * k.c, k.c], "{k:?}");
        let dw = backward_weight(&gy, &x, &k.geo(), &ty(dtype, k.w_shape())).unwrap();
        assert!(dw.is_contiguous());
        // contiguous inputs give contiguous results
        let xc = copy::contiguous(&tensor(&x.f64s(), &k.x_shape(), dtype)).unwrap();
        assert!(
            forward(&xc, &w, None, &k.geo(), &ty(dtype, k.y_shape()))
                .unwrap()
                .is_contiguous()
        );
    }
    assert!(is_channels_last(&[2, 3, 4, 5], &[60, 1, 15, 3]));
    assert!(!is_channels_last(&[2, 3, 4, 5], &[60, 20, 5, 1]));
    assert!(
        is_channels_last(&[2, 1, 4, 5], &[20, 20, 5, 1]),
        "size-1 dims: any stride"
    );
    assert!(is_channels_last(&[1, 3, 1, 1], &[3, 1, 3, 3]));
    assert!(!is_channels_last(&[2, 3, 4], &[12, 1, 3]));
}

/// f32, NCHW and channels_last, with channel counts the register tiles take (multiples of 8):
/// the forward and the weight gradient (output channels) and the input gradient (input
/// channels) run without column buffers; every geometry of `random_case` (strides,
/// dilations, uneven padding), and sizes that leave every tail of the tiles.
#[test]
fn direct_products_match_the_reference() {
    if !smelt_rt::tiles::supports(8) {
        eprintln!("skipped: no register tiles on this CPU");
        return;
    }
    let mut r = Rng(41);
    let mut input_direct = 0;
    for i in 0..40 {
        let mut k = random_case(&mut r, false, false);
        k.g = 1;
        // one side at a time may be a count the tiles do not take (the stem's one
        // input channel)
        k.c = [8, 16, 24, 32, 48, 1, 3][r.below(if i % 4 == 1 { 7 } else { 5 })];
        k.co = [8, 16, 24, 32, 40][r.below(5)];
        if i % 4 == 3 {
            (k.c, k.co) = (k.co, [1, 5][r.below(2)]);
        }
        k.h += r.below(12);
        k.w += r.below(20);
        let d = plan("t", &k.x_shape(), &k.w_shape(), &k.y_shape(), &k.geo()).unwrap();
        assert_eq!(applies(&d), k.co.is_multiple_of(8), "{k:?}");
        input_direct += usize::from(applies_to_input(&d));
        // NCHW tensors are reordered on the way in and out
        check(&k, DType::F32, &mut r, &tensor);
        check(&k, DType::F32, &mut r, &|v, s, d| {
            if s.len() == 4 && s[0] == k.n {
                channels_last(v, s, d)
            } else {
                tensor(v, s, d)
            }
        });
    }
    assert!(
        input_direct >= 20,
        "{input_direct} input gradients ran direct"
    );
}

#[test]
fn strided_views_are_read_through_their_strides() {
    let mut r = Rng(31);
    let views: [&Make; 3] = [
        // transposed: a [.., W, H] tensor with its last two dims swapped
        &|v, s, d| {
            let nd = s.len();
            let mut ts = s.to_vec();
            ts.swap(nd - 2, nd - 1);
            let (a, b) = (s[nd - 2], s[nd - 1]);
            let mut t = vec![0.0; v.len()];
            for (i, &x) in v.iter().enumerate() {
                let (o, p, q) = (i / (a * b), i / b % a, i % b);
                t[(o * b + q) * a + p] = x;
            }
            let t = tensor(&t, &ts, d);
            t.with_layout(t.layout().transpose(nd - 2, nd - 1))
        },
        // a slice of a larger tensor, with a storage offset
        &|v, s, d| {
            let mut big = s.to_vec();
            big[1] += 2;
            let nd = s.len();
            big[nd - 1] += 3;
            let mut t = vec![9.0; big.iter().product()];
            let inner: usize = s[2..].iter().product();
            for (i, &x) in v.iter().enumerate() {
                let (o, c, rest) = (i / (s[1] * inner), i / inner % s[1], i % inner);
                let last = rest % s[nd - 1];
                let mid = rest / s[nd - 1];
                let bi =
                    ((o * big[1] + c + 1) * (inner / s[nd - 1]) + mid) * big[nd - 1] + last + 2;
                t[bi] = x;
            }
            let t = tensor(&t, &big, d);
            let l = t.layout().narrow(1, 1, s[1] as i64).unwrap();
            let l = l.narrow(nd as i64 - 1, 2, s[nd - 1] as i64).unwrap();
            t.with_layout(l)
        },
        // the batch broadcast from one image when the values allow it
        &|v, s, d| {
            let one: usize = s[1..].iter().product();
            if v.len() > one && v[one..].iter().zip(v.iter().cycle()).all(|(a, b)| a == b) {
                let mut s1 = s.to_vec();
                s1[0] = 1;
                let t = tensor(&v[..one], &s1, d);
                t.with_layout(t.layout().expand(s))
            } else {
                tensor(v, s, d)
            }
        },
    ];
    for make in views {
        for i in 0..8 {
            let k = random_case(&mut r, i % 4 == 3, i % 4 == 2);
            check(&k, [DType::F64, DType::F32][i % 2], &mut r, make);
        }
    }
    // a batch that really is broadcast
    let k = random_case(&mut Rng(5), false, false);
    let one = r.values(k.c * k.h * k.w);
    let x: Vec<f64> = (0..k.n).flat_map(|_| one.iter().copied()).collect();
    let xt = tensor(&one, &k.shape(1, k.c, k.h, k.w), DType::F64);
    let xt = xt.with_layout(xt.layout().expand(&k.x_shape()));
    let w = r.values(k.w_shape().iter().product());
    let y = forward(
        &xt,
        &tensor(&w, &k.w_shape(), DType::F64),
        None,
        &k.geo(),
        &ty(DType::F64, k.y_shape()),
    )
    .unwrap();
    assert_close(&y, &k.ref_forward(&x, &w, None), 1e-10, "expanded");
}

#[test]
fn tiles_and_both_input_gradient_schedules_agree() {
    // images large enough to take several tiles, cut mid-row
    let mut r = Rng(41);
    for (i, &(n, g, s)) in [(1, 1, 1), (3, 2, 2), (9, 1, 1)].iter().enumerate() {
        let k = Case {
            n,
            c: 32 * g,
            h: 21 + 3 * i,
            w: 25,
            co: 4 * g,
            kh: 3,
            kw: 3,
            s: [s, 1],
            pl: [1, 0],
            ph: [1, 2],
            dl: [1, 2],
            g,
            bias: true,
            one_d: false,
        };
        let pixels = k.out_hw()[0] * k.out_hw()[1];
        assert!(!pixels.is_multiple_of(tile_len::<f64>(32 * 9, usize::MAX)));
        assert!(tile_len::<f64>(32 * 9, usize::MAX) < pixels);
        for dtype in [DType::F64, DType::F32] {
            check(&k, dtype, &mut r, &tensor);
            threads::serial(|| check(&k, dtype, &mut r, &tensor));
            check(&k, dtype, &mut r, &|v, s, d| {
                if s.len() == 4 && s[0] == k.n {
                    channels_last(v, s, d)
                } else {
                    tensor(v, s, d)
                }
            });
        }
    }
}

#[test]
fn empty_batches_and_channels() {
    let geo = ConvGeometry {
        stride: vec![1, 1],
        pad_lo: vec![1, 1],
        pad_hi: vec![1, 1],
        dilation: vec![1, 1],
        groups: 1,
    };
    let f = DType::F32;
    // no images
    let x = Tensor::alloc(f, &[0, 3, 5, 5]).unwrap();
    let w = Tensor::alloc(f, &[4, 3, 3, 3]).unwrap();
    let y = forward(&x, &w, None, &geo, &ty(f, vec![0, 4, 5, 5])).unwrap();
    assert_eq!(y.shape(), [0, 4, 5, 5]);
    let gy = Tensor::alloc(f, &[0, 4, 5, 5]).unwrap();
    let dx = backward_input(&gy, &w, &geo, &ty(f, vec![0, 3, 5, 5])).unwrap();
    assert_eq!(dx.shape(), [0, 3, 5, 5]);
    let dw = backward_weight(&gy, &x, &geo, &ty(f, vec![4, 3, 3, 3])).unwrap();
    assert_eq!(dw.f64s(), vec![0.0; 108]);
    // no input channels: the bias alone
    let x = Tensor::alloc(f, &[2, 0, 5, 5]).unwrap();
    let w = Tensor::alloc(f, &[4, 0, 3, 3]).unwrap();
    let b = tensor(&[1.0, 2.0, 3.0, 4.0], &[4], f);
    let y = forward(&x, &w, Some(&b), &geo, &ty(f, vec![2, 4, 5, 5])).unwrap();
    let want: Vec<f64> = (0..200).map(|i| (i / 25 % 4 + 1) as f64).collect();
    assert_eq!(y.f64s(), want);
    let gy = tensor(&vec![1.0; 200], &[2, 4, 5, 5], f);
    let dx = backward_input(&gy, &w, &geo, &ty(f, vec![2, 0, 5, 5])).unwrap();
    assert_eq!(dx.numel(), 0);
    let dw = backward_weight(&gy, &x, &geo, &ty(f, vec![4, 0, 3, 3])).unwrap();
    assert_eq!(dw.numel(), 0);
    // no output channels
    let x = tensor(&vec![1.0; 50], &[2, 1, 5, 5], f);
    let w = Tensor::alloc(f, &[0, 1, 3, 3]).unwrap();
    let y = forward(&x, &w, None, &geo, &ty(f, vec![2, 0, 5, 5])).unwrap();
    assert_eq!(y.numel(), 0);
    let gy = Tensor::alloc(f, &[2, 0, 5, 5]).unwrap();
    let dx = backward_input(&gy, &w, &geo, &ty(f, vec![2, 1, 5, 5])).unwrap();
    assert_eq!(dx.f64s(), vec![0.0; 50]);
}

#[test]
fn bad_dtypes_and_shapes_are_errors() {
    let geo = ConvGeometry {
        stride: vec![1],
        pad_lo: vec![0],
        pad_hi: vec![0],
        dilation: vec![1],
        groups: 1,
    };
    let x = Tensor::alloc(DType::I64, &[1, 2, 5]).unwrap();
    let w = Tensor::alloc(DType::I64, &[3, 2, 3]).unwrap();
    let e = forward(&x, &w, None, &geo, &ty(DType::I64, vec![1, 3, 3]));
    assert!(matches!(e, Err(crate::Error::DType(_))), "{e:?}");
    let x = Tensor::alloc(DType::F32, &[1, 2, 5]).unwrap();
    let w = Tensor::alloc(DType::F32, &[3, 2, 3]).unwrap();
    let e = forward(&x, &w, None, &geo, &ty(DType::F32, vec![1, 3, 4]));
    assert!(matches!(e, Err(crate::Error::Shape(_))), "{e:?}");
    let b = Tensor::alloc(DType::F32, &[2]).unwrap();
    let e = forward(&x, &w, Some(&b), &geo, &ty(DType::F32, vec![1, 3, 3]));
    assert!(matches!(e, Err(crate::Error::Shape(_))), "{e:?}");
    let e = forward(
        &x,
        &w,
        None,
        &ConvGeometry {
            groups: 2,
            ..geo.clone()
        },
        &ty(DType::F32, vec![1, 3, 3]),
    );
    assert!(matches!(e, Err(crate::Error::Shape(_))), "{e:?}");
    let e = forward(
        &x,
        &w,
        None,
        &ConvGeometry {
            stride: vec![0],
            ..geo
        },
        &ty(DType::F32, vec![1, 3, 3]),
    );
    assert!(e.is_err());
}

#[test]
fn valid_ranges() {
    // o·s + off in 0..n
    for s in 1..4 {
        for off in -7isize..7 {
            for n in 0..9 {
                let (lo, hi) = valid_range(1, 8, s, off, n);
                let want: Vec<usize> = (1..8)
                    .filter(|&o| (0..n as isize).contains(&(o as isize * s as isize + off)))
                    .collect();
                assert_eq!((lo..hi).collect::<Vec<_>>(), want, "{s} {off} {n}");
            }
        }
    }
}
