use super::*;
use crate::kernels::conv::channels_last_view;
use crate::kernels::copy;
use crate::kernels::copy::F64s;
use crate::tensor::threads;

/// Deterministic values (xorshift).
struct Rng(u64);

impl Rng {
    fn bits(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// In 0..n.
    fn below(&mut self, n: usize) -> usize {
        (self.bits() % n as u64) as usize
    }
    /// Values in [-1, 1), or small integers (many ties) when `coarse`.
    fn values(&mut self, n: usize, coarse: bool) -> Vec<f64> {
        (0..n)
            .map(|_| {
                if coarse {
                    self.below(7) as f64 - 3.0
                } else {
                    (self.bits() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
                }
            })
            .collect()
    }
}

#[derive(Clone, Debug)]
struct Case {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    k: [usize; 2],
    s: [usize; 2],
    p: [usize; 2],
    d: [usize; 2],
    ceil: bool,
}

impl Case {
    fn random(r: &mut Rng, dilated: bool) -> Case {
        let k = [1 + r.below(3), 1 + r.below(3)];
        let d = if dilated {
            [1 + r.below(2), 1 + r.below(2)]
        } else {
            [1, 1]
        };
        let p = [r.below(k[0] / 2 + 1), r.below(k[1] / 2 + 1)];
        let mut c = Case {
            n: 1 + r.below(2),
            c: 1 + r.below(3),
            h: 1 + r.below(9),
            w: 1 + r.below(9),
            k,
            s: [1 + r.below(3), 1 + r.below(3)],
            p,
            d,
            ceil: r.below(2) == 0,
        };
        while c.h + 2 * c.p[0] < c.d[0] * (c.k[0] - 1) + 1 {
            c.h += 1;
        }
        while c.w + 2 * c.p[1] < c.d[1] * (c.k[1] - 1) + 1 {
            c.w += 1;
        }
        c
    }
    /// PyTorch's pooling output size.
    fn out(&self, i: usize) -> usize {
        let size = [self.h, self.w][i];
        let (k, s, p, d) = (self.k[i], self.s[i], self.p[i], self.d[i]);
        let num = size + 2 * p - d * (k - 1) - 1 + if self.ceil { s - 1 } else { 0 };
        let mut o = num / s + 1;
        if self.ceil && (o - 1) * s >= size + p {
            o -= 1;
        }
        o
    }
    fn geo(&self) -> PoolGeometry {
        PoolGeometry {
            kernel: self.k,
            stride: self.s,
            padding: self.p,
            dilation: self.d,
        }
    }
    fn x_shape(&self) -> Vec<usize> {
        vec![self.n, self.c, self.h, self.w]
    }
    fn y_shape(&self) -> Vec<usize> {
        vec![self.n, self.c, self.out(0), self.out(1)]
    }
    fn planes(&self) -> usize {
        self.n * self.c
    }

    /// Max pooling in f64 and the position each window picks (PyTorch's loop: the
    /// first valid position, then any later one that is larger or NaN).
    fn ref_max(&self, x: &[f64]) -> (Vec<f64>, Vec<Option<usize>>) {
        let (oh, ow) = (self.out(0), self.out(1));
        let mut y = Vec::new();
        let mut at = Vec::new();
        for pl in 0..self.planes() {
            for a in 0..oh {
                for b in 0..ow {
                    let mut m = f64::NEG_INFINITY;
                    let mut idx = None;
                    for i in 0..self.k[0] {
                        for j in 0..self.k[1] {
                            let r = (a * self.s[0] + i * self.d[0]) as i64 - self.p[0] as i64;
                            let q = (b * self.s[1] + j * self.d[1]) as i64 - self.p[1] as i64;
                            if r < 0 || q < 0 || r >= self.h as i64 || q >= self.w as i64 {
                                continue;
                            }
                            let pos = (pl * self.h + r as usize) * self.w + q as usize;
                            if idx.is_none() {
                                idx = Some(pos);
                            }
                            if x[pos] > m || x[pos].is_nan() {
                                m = x[pos];
                                idx = Some(pos);
                            }
                        }
                    }
                    y.push(m);
                    at.push(idx);
                }
            }
        }
        (y, at)
    }

    /// Every window of average pooling as (output index, input indices, divisor).
    fn avg_windows(&self, cip: bool) -> Vec<(usize, Vec<usize>, f64)> {
        let (oh, ow) = (self.out(0), self.out(1));
        let mut all = Vec::new();
        for pl in 0..self.planes() {
            for a in 0..oh {
                for b in 0..ow {
                    let hs = (a * self.s[0]) as i64 - self.p[0] as i64;
                    let ws = (b * self.s[1]) as i64 - self.p[1] as i64;
                    let he = (hs + self.k[0] as i64).min((self.h + self.p[0]) as i64);
                    let we = (ws + self.k[1] as i64).min((self.w + self.p[1]) as i64);
                    let pool = (he - hs) * (we - ws);
                    let mut inside = Vec::new();
                    for r in hs..he {
                        for q in ws..we {
                            if r >= 0 && q >= 0 && r < self.h as i64 && q < self.w as i64 {
                                inside.push((pl * self.h + r as usize) * self.w + q as usize);
                            }
                        }
                    }
                    let div = if cip {
                        pool as f64
                    } else {
                        inside.len() as f64
                    };
                    all.push(((pl * oh + a) * ow + b, inside, div));
                }
            }
        }
        all
    }
}

/// Every window of adaptive pooling of `[n, c, h, w]` to `oh × ow`.
fn adaptive_windows(s: &[usize], oh: usize, ow: usize) -> Vec<(usize, Vec<usize>)> {
    let (h, w) = (s[2], s[3]);
    let mut all = Vec::new();
    for pl in 0..s[0] * s[1] {
        for a in 0..oh {
            for b in 0..ow {
                let (h0, h1) = ((a * h) as f64 / oh as f64, ((a + 1) * h) as f64 / oh as f64);
                let (w0, w1) = ((b * w) as f64 / ow as f64, ((b + 1) * w) as f64 / ow as f64);
                let mut inside = Vec::new();
                for r in h0.floor() as usize..h1.ceil() as usize {
                    for q in w0.floor() as usize..w1.ceil() as usize {
                        inside.push((pl * h + r) * w + q);
                    }
                }
                all.push(((pl * oh + a) * ow + b, inside));
            }
        }
    }
    all
}

fn tensor(v: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    copy::cast(&Tensor::from_vec(v.to_vec(), shape).unwrap(), dtype).unwrap()
}

/// How the tests lay out an input: contiguous, channels_last, or transposed.
#[derive(Clone, Copy, Debug)]
enum Form {
    Plain,
    ChannelsLast,
    Transposed,
}

fn make(v: &[f64], s: &[usize], dtype: DType, form: Form) -> Tensor {
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let shape = match form {
        Form::Plain => return tensor(v, s, dtype),
        Form::ChannelsLast => [n, h, w, c],
        Form::Transposed => [n, c, w, h],
    };
    let mut t = vec![0.0; v.len()];
    for (i, &x) in v.iter().enumerate() {
        let (ni, ci, hi, wi) = (i / (c * h * w), i / (h * w) % c, i / w % h, i % w);
        let at = match form {
            Form::ChannelsLast => ((ni * h + hi) * w + wi) * c + ci,
            _ => ((ni * c + ci) * w + wi) * h + hi,
        };
        t[at] = x;
    }
    let base = tensor(&t, &shape, dtype);
    match form {
        Form::ChannelsLast => channels_last_view(&base),
        _ => base.with_layout(base.layout().transpose(2, 3)),
    }
}

fn assert_close(got: &Tensor, want: &[f64], tol: f64, what: &str) {
    let got = got.f64s();
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(ok, "{what}: element {i}: got {g}, want {w}");
    }
}

fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

fn ty(dtype: DType, shape: Vec<usize>) -> TensorType {
    TensorType::new(dtype, shape)
}

/// Channels_last results for channels_last inputs (when the layouts differ).
fn check_layout(t: &Tensor, form: Form, what: &str) {
    let s = t.shape();
    if matches!(form, Form::ChannelsLast) && s[1] > 1 && s[2] * s[3] > 1 {
        assert_eq!(
            t.strides(),
            [s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]],
            "{what}"
        );
    } else if t.numel() > 0 {
        assert!(t.is_contiguous(), "{what}");
    }
}

const FORMS: [Form; 3] = [Form::Plain, Form::ChannelsLast, Form::Transposed];

#[test]
fn max_pooling_matches_the_reference() {
    let mut r = Rng(0x2545_f491_4f6c_dd1d);
    for i in 0..90 {
        let k = Case::random(&mut r, true);
        let form = FORMS[i % 3];
        let dtype = [DType::F64, DType::F32][i / 3 % 2];
        let what = format!("{k:?} {form:?} {dtype:?}");
        let x = r.values(k.x_shape().iter().product(), i % 2 == 0);
        let x = tensor(&x, &[x.len()], dtype).f64s();
        let xt = make(&x, &k.x_shape(), dtype, form);
        let y = max_pool2d(&xt, &k.geo(), &ty(dtype, k.y_shape())).unwrap();
        let (want, at) = k.ref_max(&x);
        assert_close(&y, &want, 0.0, &what);
        assert_eq!(y.dtype(), dtype);
        check_layout(&y, form, &what);
        let gy = tensor(&r.values(y.numel(), false), &k.y_shape(), dtype).f64s();
        let gyt = make(&gy, &k.y_shape(), dtype, form);
        let dx = max_pool2d_backward(&gyt, &xt, &k.geo(), &ty(dtype, k.x_shape())).unwrap();
        let mut want = vec![0.0; x.len()];
        for (o, a) in at.iter().enumerate() {
            if let Some(a) = a {
                want[*a] += gy[o];
            }
        }
        assert_close(&dx, &want, tol(dtype), &format!("backward {what}"));
        check_layout(&dx, form, &what);
    }
}

#[test]
fn average_pooling_matches_the_reference() {
    let mut r = Rng(77);
    for i in 0..90 {
        let k = Case::random(&mut r, false);
        let form = FORMS[i % 3];
        let dtype = [DType::F64, DType::F32][i / 3 % 2];
        let cip = i / 6 % 2 == 0;
        let what = format!("{k:?} {form:?} {dtype:?} count_include_pad {cip}");
        let x = tensor(
            &r.values(k.x_shape().iter().product(), false),
            &[k.x_shape().iter().product()],
            dtype,
        )
        .f64s();
        let xt = make(&x, &k.x_shape(), dtype, form);
        let y = avg_pool2d(&xt, &k.geo(), cip, &ty(dtype, k.y_shape())).unwrap();
        let windows = k.avg_windows(cip);
        let mut want = vec![0.0; y.numel()];
        for (o, inside, div) in &windows {
            if !inside.is_empty() {
                want[*o] = inside.iter().map(|&i| x[i]).sum::<f64>() / div;
            }
        }
        assert_close(&y, &want, tol(dtype), &what);
        check_layout(&y, form, &what);
        let gy = tensor(&r.values(y.numel(), false), &k.y_shape(), dtype).f64s();
        let gyt = make(&gy, &k.y_shape(), dtype, form);
        let dx = avg_pool2d_backward(&gyt, &k.geo(), cip, &ty(dtype, k.x_shape())).unwrap();
        let mut want = vec![0.0; x.len()];
        for (o, inside, div) in &windows {
            for &i in inside {
                want[i] += gy[*o] / div;
            }
        }
        assert_close(&dx, &want, tol(dtype), &format!("backward {what}"));
        check_layout(&dx, form, &what);
    }
}

#[test]
fn adaptive_pooling_matches_the_reference() {
    let mut r = Rng(99);
    for i in 0..45 {
        let s = vec![
            1 + r.below(2),
            1 + r.below(3),
            1 + r.below(9),
            1 + r.below(9),
        ];
        let (oh, ow) = (1 + r.below(8), 1 + r.below(8));
        let ys = vec![s[0], s[1], oh, ow];
        let form = FORMS[i % 3];
        let dtype = [DType::F64, DType::F32][i / 3 % 2];
        let what = format!("{s:?} to {oh}x{ow} {form:?} {dtype:?}");
        let x = tensor(
            &r.values(s.iter().product(), false),
            &[s.iter().product()],
            dtype,
        )
        .f64s();
        let xt = make(&x, &s, dtype, form);
        let y = adaptive_avg_pool2d(&xt, &ty(dtype, ys.clone())).unwrap();
        let windows = adaptive_windows(&s, oh, ow);
        let mut want = vec![0.0; y.numel()];
        for (o, inside) in &windows {
            want[*o] = inside.iter().map(|&i| x[i]).sum::<f64>() / inside.len() as f64;
        }
        assert_close(&y, &want, tol(dtype), &what);
        check_layout(&y, form, &what);
        let gy = tensor(&r.values(y.numel(), false), &ys, dtype).f64s();
        let gyt = make(&gy, &ys, dtype, form);
        let dx = adaptive_avg_pool2d_backward(&gyt, &ty(dtype, s.clone())).unwrap();
        let mut want = vec![0.0; x.len()];
        for (o, inside) in &windows {
            for &i in inside {
                want[i] += gy[*o] / inside.len() as f64;
            }
        }
        assert_close(&dx, &want, tol(dtype), &format!("backward {what}"));
        check_layout(&dx, form, &what);
    }
}

#[test]
fn ties_go_to_the_first_maximum_and_nans_win() {
    let geo = PoolGeometry {
        kernel: [2, 2],
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
    };
    let f = DType::F32;
    for form in FORMS {
        // overlapping windows over equal values: each goes to its top-left element
        let x = make(&[1.0; 9], &[1, 1, 3, 3], f, form);
        let gy = tensor(&[1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2], f);
        let dx = max_pool2d_backward(&gy, &x, &geo, &ty(f, vec![1, 1, 3, 3])).unwrap();
        assert_eq!(dx.f64s(), [1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]);
        // a NaN is the maximum of every window that holds it
        let v = [0.0, 5.0, 1.0, 2.0, f64::NAN, 3.0, 9.0, 4.0, 1.0];
        let x = make(&v, &[1, 1, 3, 3], f, form);
        let y = max_pool2d(&x, &geo, &ty(f, vec![1, 1, 2, 2])).unwrap();
        assert!(y.f64s().iter().all(|v| v.is_nan()), "{form:?}");
        let dx = max_pool2d_backward(&gy, &x, &geo, &ty(f, vec![1, 1, 3, 3])).unwrap();
        assert_eq!(dx.f64s()[4], 10.0);
    }
}

#[test]
fn integers_and_halves() {
    let k = Case {
        n: 2,
        c: 3,
        h: 5,
        w: 6,
        k: [3, 2],
        s: [2, 2],
        p: [1, 1],
        d: [1, 2],
        ceil: true,
    };
    let mut r = Rng(5);
    let x = r.values(k.x_shape().iter().product(), true);
    let (want, _) = k.ref_max(&x);
    for dtype in [DType::I64, DType::I32, DType::I16, DType::I8] {
        let y = max_pool2d(
            &tensor(&x, &k.x_shape(), dtype),
            &k.geo(),
            &ty(dtype, k.y_shape()),
        );
        let y = y.unwrap();
        assert_eq!(y.dtype(), dtype);
        assert_eq!(y.f64s(), want, "{dtype:?}");
    }
    let xu: Vec<f64> = x.iter().map(|v| v + 3.0).collect();
    let y = max_pool2d(
        &tensor(&xu, &k.x_shape(), DType::U8),
        &k.geo(),
        &ty(DType::U8, k.y_shape()),
    );
    let wu: Vec<f64> = want.iter().map(|v| v + 3.0).collect();
    assert_eq!(y.unwrap().f64s(), wu);
    let b = Tensor::alloc(DType::Bool, &k.x_shape()).unwrap();
    let e = max_pool2d(&b, &k.geo(), &ty(DType::Bool, k.y_shape()));
    assert!(matches!(e, Err(crate::Error::DType(_))), "{e:?}");
    let xi = tensor(&x, &k.x_shape(), DType::I64);
    let e = avg_pool2d(
        &xi,
        &PoolGeometry {
            dilation: [1, 1],
            ..k.geo()
        },
        true,
        &ty(DType::I64, k.y_shape()),
    );
    assert!(matches!(e, Err(crate::Error::DType(_))), "{e:?}");
    let e = avg_pool2d(
        &tensor(&x, &k.x_shape(), DType::F32),
        &k.geo(),
        true,
        &ty(DType::F32, k.y_shape()),
    );
    assert!(matches!(e, Err(crate::Error::Unsupported(_))), "{e:?}");
    for dtype in [DType::F16, DType::BF16] {
        let xt = tensor(&x, &k.x_shape(), dtype);
        let y = max_pool2d(&xt, &k.geo(), &ty(dtype, k.y_shape())).unwrap();
        assert_eq!((y.dtype(), y.f64s()), (dtype, want.clone()));
        let g = PoolGeometry {
            dilation: [1, 1],
            ..k.geo()
        };
        let c = Case {
            d: [1, 1],
            ..k.clone()
        };
        let y = avg_pool2d(&xt, &g, false, &ty(dtype, c.y_shape())).unwrap();
        let mut want = vec![0.0; y.numel()];
        for (o, inside, div) in c.avg_windows(false) {
            want[o] = inside.iter().map(|&i| x[i]).sum::<f64>() / div;
        }
        assert_close(&y, &want, tol(dtype), "half avg");
        let want_len = k.y_shape().iter().product::<usize>();
        let dx = max_pool2d_backward(
            &tensor(&vec![1.0; want_len], &k.y_shape(), dtype),
            &xt,
            &k.geo(),
            &ty(dtype, k.x_shape()),
        )
        .unwrap();
        assert_eq!(dx.dtype(), dtype);
        assert_eq!(dx.f64s().iter().sum::<f64>(), want_len as f64);
    }
}

#[test]
fn empty_inputs() {
    let geo = PoolGeometry {
        kernel: [2, 2],
        stride: [2, 2],
        padding: [0, 0],
        dilation: [1, 1],
    };
    let f = DType::F32;
    for s in [[0, 3, 4, 4], [2, 0, 4, 4]] {
        let ys = vec![s[0], s[1], 2, 2];
        let x = Tensor::alloc(f, &s).unwrap();
        let gy = Tensor::alloc(f, &ys).unwrap();
        assert_eq!(
            max_pool2d(&x, &geo, &ty(f, ys.clone())).unwrap().shape(),
            ys
        );
        assert_eq!(
            avg_pool2d(&x, &geo, true, &ty(f, ys.clone()))
                .unwrap()
                .shape(),
            ys
        );
        assert_eq!(
            adaptive_avg_pool2d(&x, &ty(f, ys.clone())).unwrap().shape(),
            ys
        );
        let xs = s.to_vec();
        assert_eq!(
            max_pool2d_backward(&gy, &x, &geo, &ty(f, xs.clone()))
                .unwrap()
                .shape(),
            xs
        );
        assert_eq!(
            avg_pool2d_backward(&gy, &geo, true, &ty(f, xs.clone()))
                .unwrap()
                .shape(),
            xs
        );
        assert_eq!(
            adaptive_avg_pool2d_backward(&gy, &ty(f, xs.clone()))
                .unwrap()
                .shape(),
            xs
        );
    }
    // an empty adaptive output: nothing flows back
    let x = tensor(&[1.0; 8], &[1, 2, 2, 2], f);
    assert_eq!(
        adaptive_avg_pool2d(&x, &ty(f, vec![1, 2, 0, 2]))
            .unwrap()
            .numel(),
        0
    );
    let gy = Tensor::alloc(f, &[1, 2, 0, 2]).unwrap();
    let dx = adaptive_avg_pool2d_backward(&gy, &ty(f, vec![1, 2, 2, 2])).unwrap();
    assert_eq!(dx.f64s(), vec![0.0; 8]);
    let e = max_pool2d(&x, &geo, &ty(f, vec![1, 3, 1, 1]));
    assert!(matches!(e, Err(crate::Error::Shape(_))), "{e:?}");
}

#[test]
fn large_inputs_run_in_parallel_alike() {
    // enough work to cross PAR_WORK, in both layouts and on one thread
    let k = Case {
        n: 3,
        c: 16,
        h: 33,
        w: 31,
        k: [3, 3],
        s: [2, 2],
        p: [1, 1],
        d: [1, 1],
        ceil: false,
    };
    let mut r = Rng(3);
    let x = r.values(k.x_shape().iter().product(), true);
    let (want, _) = k.ref_max(&x);
    for form in FORMS {
        let xt = make(&x, &k.x_shape(), DType::F64, form);
        let y = max_pool2d(&xt, &k.geo(), &ty(DType::F64, k.y_shape())).unwrap();
        assert_close(&y, &want, 0.0, "parallel");
        let y = threads::serial(|| max_pool2d(&xt, &k.geo(), &ty(DType::F64, k.y_shape())));
        assert_close(&y.unwrap(), &want, 0.0, "serial");
        let gy = make(&vec![1.0; want.len()], &k.y_shape(), DType::F64, form);
        let a = max_pool2d_backward(&gy, &xt, &k.geo(), &ty(DType::F64, k.x_shape())).unwrap();
        let b = threads::serial(|| {
            max_pool2d_backward(&gy, &xt, &k.geo(), &ty(DType::F64, k.x_shape()))
        });
        assert_eq!(a.f64s(), b.unwrap().f64s());
        assert_eq!(a.f64s().iter().sum::<f64>(), want.len() as f64);
    }
}
