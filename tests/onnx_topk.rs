//! ONNX `TopK` (unrolled into rounds of a masked maximum) against smelt's eager
//! `Tensor::topk` kernel, on random inputs with many ties, both directions, every axis,
//! odd sizes and k from 0 to the axis length, on the interpreter and compiled.

use prost::Message;
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::onnx::proto::{AttributeProto, GraphProto, TensorProto, attribute_type, data_type};
use smelt::{DType, Tensor};

mod common;
use common::onnx_protos::{model, node, value};

fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INT,
        i,
        ..Default::default()
    }
}

/// `(values, indices) = TopK(x, K)` for `x` of f32 `shape`.
fn topk_model(shape: &[usize], k: i64, axis: i64, largest: bool) -> smelt::onnx::Model {
    let mut n = node("TopK", "t", &["x", "k"], &["v", "i"]);
    n.attribute = vec![int_attr("axis", axis), int_attr("largest", largest.into())];
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut out = dims.clone();
    let a = axis.rem_euclid(dims.len() as i64) as usize;
    out[a] = k;
    let m = model(
        21,
        GraphProto {
            name: "g".into(),
            node: vec![n],
            input: vec![value("x", data_type::FLOAT, &dims)],
            initializer: vec![TensorProto {
                name: "k".into(),
                dims: vec![1],
                data_type: data_type::INT64,
                int64_data: vec![k],
                ..Default::default()
            }],
            output: vec![
                value("v", data_type::FLOAT, &out),
                value("i", data_type::INT64, &out),
            ],
            ..Default::default()
        },
    );
    smelt::onnx::from_bytes(&m.encode_to_vec(), None).unwrap()
}

#[test]
fn topk_matches_the_eager_kernel_with_ties_on_every_path() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for shape in [vec![1usize], vec![7], vec![3, 5], vec![2, 9, 4]] {
        let n: usize = shape.iter().product();
        // few distinct values: most rounds meet ties
        let xs: Vec<f32> = (0..n).map(|_| (next() % 5) as f32 - 2.0).collect();
        let x = Tensor::from_slice(&xs, &shape).unwrap();
        for axis in 0..shape.len() as i64 {
            let len = shape[axis as usize];
            for k in [0, 1, len / 2, len] {
                for largest in [true, false] {
                    let (want_v, want_i) = x.topk(k, axis, largest, true).unwrap();
                    let m = topk_model(&shape, k as i64, axis - shape.len() as i64, largest);
                    let imp = m.import_for(&[("x", &x)]).unwrap();
                    let inputs = imp.bind(&[("x", x.clone())]).unwrap();
                    let interp =
                        smelt::runtime::interp::run_positional(&imp.graph, &inputs).unwrap();
                    let f = CompiledFn::compile(&imp.graph, &CompileOptions::default()).unwrap();
                    let compiled = f.call(&inputs).unwrap();
                    for (how, got) in [("interpreter", interp), ("compiled", compiled)] {
                        let what =
                            format!("{how}: shape {shape:?} axis {axis} k {k} largest {largest}");
                        assert_eq!(got[0].shape(), want_v.shape(), "{what}");
                        assert_eq!(got[1].dtype(), DType::I64, "{what}");
                        assert_eq!(
                            got[0].to_vec::<f32>().unwrap(),
                            want_v.to_vec::<f32>().unwrap(),
                            "{what}"
                        );
                        assert_eq!(
                            got[1].to_vec::<i64>().unwrap(),
                            want_i.to_vec::<i64>().unwrap(),
                            "{what}"
                        );
                    }
                }
            }
        }
    }
}
