//! ONNX element types smelt holds in a wider dtype: `Cast` to the float8 and float4 formats
//! against a brute-force reference (the nearest of every value the format has, ties to the
//! even pattern), on the interpreter and compiled; the sub-byte integers' wrap-around; and
//! unsigned outputs written in their own `.npy` type.

use prost::Message;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::onnx::proto::{AttributeProto, GraphProto, attribute_type, data_type};
use smelt::{DType, Tensor};

mod common;
use common::onnx_protos::{model, node, value};

/// A float format as its specification publishes it.
struct Format {
    code: i32,
    mantissa: i32,
    emin: i32,
    max: f64,
    inf: bool,
    nan: bool,
    neg_zero: bool,
}

const FORMATS: &[Format] = &[
    // FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ, FLOAT4E2M1
    Format {
        code: 17,
        mantissa: 3,
        emin: -6,
        max: 448.0,
        inf: false,
        nan: true,
        neg_zero: true,
    },
    Format {
        code: 18,
        mantissa: 3,
        emin: -7,
        max: 240.0,
        inf: false,
        nan: true,
        neg_zero: false,
    },
    Format {
        code: 19,
        mantissa: 2,
        emin: -14,
        max: 57344.0,
        inf: true,
        nan: true,
        neg_zero: true,
    },
    Format {
        code: 20,
        mantissa: 2,
        emin: -15,
        max: 57344.0,
        inf: false,
        nan: true,
        neg_zero: false,
    },
    Format {
        code: 23,
        mantissa: 1,
        emin: 0,
        max: 6.0,
        inf: false,
        nan: false,
        neg_zero: true,
    },
];

impl Format {
    /// Every finite non-negative value, ascending: the index's parity is the last mantissa
    /// bit's.
    fn values(&self) -> Vec<f64> {
        let steps = 1i32 << self.mantissa;
        let mut v: Vec<f64> = (0..steps)
            .map(|k| k as f64 * 2f64.powi(self.emin - self.mantissa))
            .collect();
        let mut e = self.emin;
        loop {
            for k in 0..steps {
                let x = (1.0 + k as f64 / steps as f64) * 2f64.powi(e);
                if x > self.max {
                    return v;
                }
                v.push(x);
            }
            e += 1;
        }
    }

    fn special(&self, saturate: bool, negative: bool) -> f64 {
        let v = if saturate || !(self.inf || self.nan) {
            self.max
        } else if self.inf {
            f64::INFINITY
        } else {
            return f64::NAN;
        };
        if negative { -v } else { v }
    }

    /// The value `x` converts to.
    fn reference(&self, x: f32, saturate: bool) -> f32 {
        let x = f64::from(x);
        if x.is_nan() {
            return if self.nan { f32::NAN } else { -0.0 };
        }
        let neg = x.is_sign_negative();
        if x.is_infinite() {
            return self.special(saturate, neg) as f32;
        }
        let a = x.abs();
        let vals = self.values();
        let top = vals.len() - 1;
        let ulp = vals[top] - vals[top - 1];
        let mut r = if a > self.max + ulp / 2.0 || a == self.max + ulp / 2.0 && top % 2 == 1 {
            self.special(saturate, false)
        } else {
            let i = vals.partition_point(|&v| v < a).min(top);
            let mut best = i;
            if i > 0 {
                let (lo, hi) = (a - vals[i - 1], vals[i] - a);
                if lo < hi || lo == hi && (i - 1) % 2 == 0 {
                    best = i - 1;
                }
            }
            vals[best]
        };
        if neg {
            r = -r;
        }
        if r == 0.0 && !self.neg_zero {
            r = 0.0;
        }
        r as f32
    }
}

fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i,
        ..Default::default()
    }
}

/// `y = Cast(x, to=to, saturate=saturate)` for `x` of `from`[n].
fn cast_model(from: i32, to: i32, saturate: bool, n: usize) -> smelt::onnx::Model {
    cast_model_with(from, to, saturate, n, None)
}

/// [`cast_model`] with a `round_mode` attribute when given.
fn cast_model_with(
    from: i32,
    to: i32,
    saturate: bool,
    n: usize,
    round_mode: Option<&str>,
) -> smelt::onnx::Model {
    let mut cast = node("Cast", "c", &["x"], &["y"]);
    cast.attribute = vec![
        int_attr("to", to.into()),
        int_attr("saturate", saturate.into()),
    ];
    if let Some(mode) = round_mode {
        cast.attribute.push(AttributeProto {
            name: "round_mode".into(),
            r#type: attribute_type::STRING,
            s: mode.as_bytes().to_vec(),
            ..Default::default()
        });
    }
    let m = model(
        21,
        GraphProto {
            name: "g".into(),
            node: vec![cast],
            input: vec![value("x", from, &[n as i64])],
            output: vec![value("y", to, &[n as i64])],
            ..Default::default()
        },
    );
    smelt::onnx::from_bytes(&m.encode_to_vec(), None).unwrap()
}

/// The outputs of `m` on input `x`: the interpreter's, then compiled code's.
fn both(m: &smelt::onnx::Model, x: Tensor) -> [Tensor; 2] {
    let imp = m.import_for(&[("x", &x)]).unwrap();
    let inputs = imp.bind(&[("x", x)]).unwrap();
    let interp = smelt::runtime::interp::run_positional(&imp.graph, &inputs).unwrap();
    let f = CompiledFn::compile(&imp.graph, &CompileOptions::default()).unwrap();
    let compiled = f.call(&inputs).unwrap();
    [interp[0].clone(), compiled[0].clone()]
}

/// Inputs that probe every binade: random magnitudes, the exact midpoints between
/// neighbouring values (ties), values just past the largest, and the specials.
fn probes(f: &Format, rng: &mut u64) -> Vec<f32> {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        (*rng >> 11) as f64 / (1u64 << 53) as f64
    };
    let vals = f.values();
    let mut xs = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e30,
        -1e30,
    ];
    for w in vals.windows(2) {
        let mid = (w[0] + w[1]) / 2.0;
        xs.extend([mid as f32, -mid as f32, w[1] as f32]);
    }
    let ulp = vals[vals.len() - 1] - vals[vals.len() - 2];
    for k in [0.25, 0.5, 0.75, 1.0, 3.0] {
        xs.extend([(f.max + k * ulp) as f32, -(f.max + k * ulp) as f32]);
    }
    let (lo, hi) = (f.emin - f.mantissa - 3, f.max.log2() as i32 + 3);
    for _ in 0..300 {
        let e = lo as f64 + next() * (hi - lo) as f64;
        let s = if next() < 0.5 { -1.0 } else { 1.0 };
        xs.push((s * 2f64.powf(e)) as f32);
    }
    xs
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan()
}

#[test]
fn casts_to_float8_and_float4_round_to_the_nearest_value_ties_to_even() {
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for f in FORMATS {
        let xs = probes(f, &mut rng);
        for saturate in [true, false] {
            let m = cast_model(data_type::FLOAT, f.code, saturate, xs.len());
            let x = Tensor::from_slice(&xs, &[xs.len()]).unwrap();
            for (how, y) in ["interpreter", "compiled"].iter().zip(both(&m, x)) {
                assert_eq!(y.dtype(), DType::F32);
                let got = y.to_vec::<f32>().unwrap();
                for (&x, &g) in xs.iter().zip(&got) {
                    let want = f.reference(x, saturate);
                    assert!(
                        same(g, want),
                        "format {} saturate={saturate} ({how}): {x:e} gave {g:e}, want {want:e}",
                        f.code
                    );
                }
            }
        }
    }
}

/// float8e8m0 by the ONNX reference's rule, written on f32 bits: the exponent field,
/// raised by `mode`, held at 254 under `saturate`; NaN and infinities are NaN.
fn e8m0_reference(x: f32, mode: &str, saturate: bool) -> f32 {
    let bits = x.to_bits() & 0x7fff_ffff;
    let exp = bits >> 23;
    if exp == 0xff {
        return f32::NAN;
    }
    let raise = match mode {
        "up" => bits & 0x7f_ffff != 0,
        "nearest" => {
            let (g, r, s) = (bits & 0x40_0000, bits & 0x20_0000, bits & 0x1f_ffff);
            g != 0 && (r != 0 || s != 0 || exp > 0)
        }
        _ => false,
    };
    let code = exp + u32::from(raise && !(saturate && exp == 254));
    if code == 255 {
        f32::NAN
    } else {
        2f64.powi(code as i32 - 127) as f32
    }
}

/// Casts to float8e8m0 in every rounding mode, saturating or not, on powers of two, their
/// neighbours, midpoints, the largest and smallest floats, zero and the specials.
#[test]
fn casts_to_float8e8m0_follow_the_reference_rule() {
    let mut xs: Vec<f32> = vec![0.0, 1.0, 1.5, 1.75, 1.25, 3.0, f32::MAX, f32::MIN_POSITIVE];
    xs.extend([
        1e-45,
        1e-40,
        f32::INFINITY,
        f32::NAN,
        0.124,
        6e37,
        2.5e38,
        1.3e-38,
    ]);
    for e in (-126..=127).step_by(7) {
        let p = 2f32.powi(e);
        xs.extend([
            p,
            p * 1.5,
            f32::from_bits(p.to_bits() + 1),
            f32::from_bits(p.to_bits() - 1),
        ]);
    }
    let x = Tensor::from_slice(&xs, &[xs.len()]).unwrap();
    for mode in ["up", "down", "nearest"] {
        for saturate in [true, false] {
            let m = cast_model_with(data_type::FLOAT, 24, saturate, xs.len(), Some(mode));
            let [interp, compiled] = both(&m, x.clone());
            for got in [interp, compiled] {
                assert_eq!(got.dtype(), DType::F32);
                for (i, (&x, g)) in xs.iter().zip(got.to_vec::<f32>().unwrap()).enumerate() {
                    let want = e8m0_reference(x, mode, saturate);
                    assert!(
                        same(g, want),
                        "{mode} saturate={saturate}: element {i} ({x:e}): {g:e} instead of {want:e}"
                    );
                }
            }
        }
    }
}

#[test]
fn float8_casts_of_empty_and_single_element_tensors() {
    for n in [0usize, 1] {
        let m = cast_model(data_type::FLOAT, 17, true, n);
        let xs = vec![300.0f32; n];
        for y in both(&m, Tensor::from_slice(&xs, &[n]).unwrap()) {
            assert_eq!(y.shape(), &[n]);
            assert_eq!(y.to_vec::<f32>().unwrap(), vec![288.0f32; n]);
        }
    }
}

#[test]
fn integers_cast_to_int4_and_uint2_wrap_to_their_width() {
    let xs: Vec<i32> = (-40..40).collect();
    // INT4 and UINT2: the low 4 (2) bits, read signed (unsigned)
    for (code, bits, signed) in [(22, 4u32, true), (25, 2, false)] {
        let m = cast_model(data_type::INT32, code, true, xs.len());
        for y in both(&m, Tensor::from_slice(&xs, &[xs.len()]).unwrap()) {
            let got = y.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap();
            for (&x, &g) in xs.iter().zip(&got) {
                let low = i64::from(x) & ((1 << bits) - 1);
                let want = if signed && low >= 1 << (bits - 1) {
                    low - (1 << bits)
                } else {
                    low
                };
                assert_eq!(g, want, "{x} to {code}");
            }
        }
    }
}

#[test]
fn unsigned_outputs_are_written_in_their_own_type_modulo_their_width() {
    let dir = std::env::temp_dir().join(format!("smelt-onnx-types-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let m = model(
        21,
        GraphProto {
            name: "g".into(),
            node: vec![node("Add", "a", &["x", "y"], &["z"])],
            input: vec![
                value("x", data_type::UINT16, &[3]),
                value("y", data_type::UINT16, &[3]),
            ],
            output: vec![value("z", data_type::UINT16, &[3])],
            ..Default::default()
        },
    );
    let path = dir.join("add.onnx");
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let x = Tensor::from_slice(&[60000i32, 1, 65535], &[3]).unwrap();
    let y = Tensor::from_slice(&[10000i32, 2, 1], &[3]).unwrap();
    let mut inputs = Vec::new();
    for (name, t) in [("x", x), ("y", y)] {
        let p = dir.join(format!("{name}.npy"));
        smelt::runtime::npy::write_npy(&p, &t).unwrap();
        inputs.push((name.to_string(), p));
    }
    let out = dir.join("out");
    smelt::cli::run(&smelt::cli::RunArgs {
        model: path,
        inputs,
        out: out.clone(),
        backend: smelt::cli::Backend::Cpu,
        no_fuse: false,
        graph: None,
        weights: None,
        repeat: 0,
    })
    .unwrap();
    let bytes = std::fs::read(out.join("out0.npy")).unwrap();
    assert!(String::from_utf8_lossy(&bytes[..bytes.len().min(128)]).contains("'<u2'"));
    let z = smelt::runtime::npy::read_npy(out.join("out0.npy")).unwrap();
    assert_eq!(z.to_vec::<i32>().unwrap(), [70000 - 65536, 3, 0]);
    let _ = std::fs::remove_dir_all(&dir);
}
