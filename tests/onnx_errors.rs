//! ONNX files that are truncated, corrupt or hostile, and models smelt cannot run: each is a
//! clean error that says what is wrong, never a panic or an allocation of what the file
//! claims.

use prost::Message;
use smelt::Tensor;
use smelt::onnx::proto::{
    AttributeProto, GraphProto, ModelProto, StringStringEntryProto, TensorProto, ValueInfoProto,
    attribute_type, data_type,
};
use std::path::Path;

mod common;
use common::onnx_protos::{model, node, value};

/// `y = relu(x)` over f32[2, 3].
fn relu_model() -> ModelProto {
    model(
        17,
        GraphProto {
            name: "g".into(),
            node: vec![node("Relu", "r", &["x"], &["y"])],
            input: vec![value("x", data_type::FLOAT, &[2, 3])],
            output: vec![value("y", data_type::FLOAT, &[2, 3])],
            ..Default::default()
        },
    )
}

/// The error of importing `m` (decoding it from bytes first).
fn import_error(m: &ModelProto, dir: Option<&Path>) -> String {
    let bytes = m.encode_to_vec();
    match smelt::onnx::from_bytes(&bytes, dir).and_then(|m| m.import(&[])) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_valid_model_runs() {
    let m = smelt::onnx::from_bytes(&relu_model().encode_to_vec(), None).unwrap();
    let imp = m.import(&[]).unwrap();
    let x = Tensor::from_vec(vec![-1f32, 2., -3., 4., 0., 6.], &[2, 3]).unwrap();
    let y = smelt::runtime::interp::run_positional(&imp.graph, &imp.bind(&[("x", x)]).unwrap())
        .unwrap();
    assert_eq!(y[0].to_vec::<f32>().unwrap(), [0., 2., 0., 4., 0., 6.]);
}

#[test]
fn truncated_and_corrupt_files_are_errors() {
    let bytes = relu_model().encode_to_vec();
    for cut in [1, bytes.len() / 3, bytes.len() / 2, bytes.len() - 1] {
        let e = smelt::onnx::from_bytes(&bytes[..cut], None)
            .and_then(|m| m.import(&[]))
            .unwrap_err()
            .to_string();
        assert!(!e.is_empty());
    }
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let e = smelt::onnx::from_bytes(&garbage, None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not a valid ONNX model") || e.contains("opset") || e.contains("graph"),
        "{e}"
    );
}

#[test]
fn a_tensor_claiming_a_trillion_elements_allocates_nothing() {
    let mut m = relu_model();
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![1_000_000, 1_000_000],
        data_type: data_type::FLOAT,
        raw_data: vec![0; 16],
        ..Default::default()
    });
    let e = import_error(&m, None);
    assert!(e.contains("raw_data holds 16 bytes"), "{e}");
    // the same claim through typed data
    let g = m.graph.as_mut().unwrap();
    g.initializer[0].raw_data.clear();
    g.initializer[0].float_data = vec![1.0; 4];
    let e = import_error(&m, None);
    assert!(e.contains("float_data holds 4 elements"), "{e}");
    // and one past what fits in memory at all
    let g = m.graph.as_mut().unwrap();
    g.initializer[0].dims = vec![i64::MAX, 4];
    let e = import_error(&m, None);
    assert!(e.contains("too large"), "{e}");
}

#[test]
fn a_negative_dim_is_an_error() {
    let mut m = relu_model();
    m.graph.as_mut().unwrap().initializer.push(TensorProto {
        name: "w".into(),
        dims: vec![3, -2],
        data_type: data_type::FLOAT,
        ..Default::default()
    });
    let e = import_error(&m, None);
    assert!(e.contains("negative dimension -2"), "{e}");
}

#[test]
fn a_cycle_and_a_missing_input_are_errors() {
    let mut m = relu_model();
    let g = m.graph.as_mut().unwrap();
    g.node = vec![
        node("Add", "a", &["x", "b_out"], &["a_out"]),
        node("Relu", "b", &["a_out"], &["b_out"]),
        node("Relu", "r", &["b_out"], &["y"]),
    ];
    let e = import_error(&m, None);
    assert!(
        e.contains("'b_out' is used before") && e.contains("cycle"),
        "{e}"
    );
    let g = m.graph.as_mut().unwrap();
    g.node = vec![node("Add", "a", &["x", "nowhere"], &["y"])];
    let e = import_error(&m, None);
    assert!(e.contains("'nowhere'"), "{e}");
}

#[test]
fn unsupported_ops_and_types_are_named() {
    let mut m = relu_model();
    m.opset_import[0].version = 11;
    m.graph.as_mut().unwrap().node = vec![node("NonMaxSuppression", "nms_3", &["x"], &["y"])];
    assert_eq!(
        import_error(&m, None),
        "ONNX op 'NonMaxSuppression' (opset 11, node 'nms_3') is not supported"
    );
    let mut m = relu_model();
    m.graph.as_mut().unwrap().input = vec![value("x", 14, &[2, 3])];
    let e = import_error(&m, None);
    assert!(e.contains("complex64 is not supported"), "{e}");
    let mut m = relu_model();
    m.graph.as_mut().unwrap().node[0].domain = "com.microsoft".into();
    let e = import_error(&m, None);
    assert!(e.contains("domain 'com.microsoft'"), "{e}");
}

#[test]
fn wrong_inputs_are_errors() {
    let m = smelt::onnx::from_bytes(&relu_model().encode_to_vec(), None).unwrap();
    let e = m.import(&[("x", &[2, 4])]).unwrap_err().to_string();
    assert!(e.contains("input 'x' has shape"), "{e}");
    let e = m.import(&[("z", &[2, 3])]).unwrap_err().to_string();
    assert!(e.contains("no input named 'z'"), "{e}");
    let imp = m.import(&[]).unwrap();
    let wrong = Tensor::from_vec(vec![0f64; 6], &[2, 3]).unwrap();
    let e = smelt::runtime::interp::run_positional(&imp.graph, &imp.bind(&[("x", wrong)]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("f32") && e.contains("f64"), "{e}");
}

#[test]
fn a_huge_constant_of_shape_is_refused() {
    let mut m = relu_model();
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(TensorProto {
        name: "shape".into(),
        dims: vec![2],
        data_type: data_type::INT64,
        int64_data: vec![1 << 30, 1 << 30],
        ..Default::default()
    });
    g.node = vec![
        node("ConstantOfShape", "big", &["shape"], &["c"]),
        node("Relu", "r", &["x"], &["y"]),
    ];
    let e = import_error(&m, None);
    assert!(e.contains("larger than smelt holds"), "{e}");
}

/// Constants an op builds at import (a window, DFT matrices) from a hostile size are refused
/// before anything is allocated.
#[test]
fn huge_sizes_of_constants_built_at_import_are_refused() {
    let sized = |op: &str, inputs: &[&str], sizes: Vec<i64>| {
        let mut m = relu_model();
        m.opset_import[0].version = 20;
        let g = m.graph.as_mut().unwrap();
        g.initializer.push(TensorProto {
            name: "n".into(),
            dims: vec![],
            data_type: data_type::INT64,
            int64_data: sizes,
            ..Default::default()
        });
        g.node = vec![
            node(op, "big", inputs, &["w"]),
            node("Relu", "r", &["x"], &["y"]),
        ];
        import_error(&m, None)
    };
    let e = sized("HannWindow", &["n"], vec![1_000_000_000_000]);
    assert!(e.contains("the window would hold more than"), "{e}");
    // a DFT of the [2, 3] input (as one real part) to 10^12 points
    let mut m = relu_model();
    m.opset_import[0].version = 20;
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(TensorProto {
        name: "len".into(),
        dims: vec![],
        data_type: data_type::INT64,
        int64_data: vec![1_000_000_000_000],
        ..Default::default()
    });
    g.initializer.push(TensorProto {
        name: "shape".into(),
        dims: vec![3],
        data_type: data_type::INT64,
        int64_data: vec![1, 6, 1],
        ..Default::default()
    });
    g.node = vec![
        node("Reshape", "r3", &["x", "shape"], &["x3"]),
        node("DFT", "dft", &["x3", "len"], &["f"]),
        node("Relu", "r", &["x"], &["y"]),
    ];
    let e = import_error(&m, None);
    assert!(e.contains("the DFT matrices would hold more than"), "{e}");
}

/// External data: read from beside the model, refused outside its folder.
#[test]
fn external_data_stays_in_the_models_folder() {
    let root = std::env::temp_dir().join(format!("smelt-onnx-ext-{}", std::process::id()));
    let dir = root.join("model");
    std::fs::create_dir_all(&dir).unwrap();
    let values: Vec<u8> = [1f32, 2., 3.]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    std::fs::write(dir.join("weights.bin"), &values).unwrap();
    std::fs::write(root.join("outside.bin"), &values).unwrap();
    let with_location = |location: &str| {
        let mut m = relu_model();
        let g = m.graph.as_mut().unwrap();
        g.initializer.push(TensorProto {
            name: "b".into(),
            dims: vec![3],
            data_type: data_type::FLOAT,
            data_location: 1,
            external_data: vec![
                StringStringEntryProto {
                    key: "location".into(),
                    value: location.into(),
                },
                StringStringEntryProto {
                    key: "length".into(),
                    value: "12".into(),
                },
            ],
            ..Default::default()
        });
        g.node = vec![node("Add", "a", &["x", "b"], &["y"])];
        m
    };
    // inside: the values arrive
    let m = with_location("weights.bin");
    std::fs::write(dir.join("ok.onnx"), m.encode_to_vec()).unwrap();
    let model = smelt::onnx::load(dir.join("ok.onnx")).unwrap();
    let b = &model.initializers()[0].1;
    assert_eq!(b.to_vec::<f32>().unwrap(), [1., 2., 3.]);
    // outside: refused, by each road out
    let outside = root.join("outside.bin").display().to_string();
    for (location, why) in [
        ("../outside.bin", "leaves the model's folder"),
        (outside.as_str(), "absolute path"),
    ] {
        let m = with_location(location);
        std::fs::write(dir.join("bad.onnx"), m.encode_to_vec()).unwrap();
        let e = smelt::onnx::load(dir.join("bad.onnx"))
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{location}: {e}");
    }
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(root.join("outside.bin"), dir.join("link.bin")).unwrap();
        let m = with_location("link.bin");
        std::fs::write(dir.join("bad.onnx"), m.encode_to_vec()).unwrap();
        let e = smelt::onnx::load(dir.join("bad.onnx"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
    }
    // more bytes claimed than the file holds
    let mut m = with_location("weights.bin");
    let t = &mut m.graph.as_mut().unwrap().initializer[0];
    t.dims = vec![1 << 40];
    t.external_data.retain(|e| e.key == "location");
    std::fs::write(dir.join("bad.onnx"), m.encode_to_vec()).unwrap();
    let e = smelt::onnx::load(dir.join("bad.onnx"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("holds 12"), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}

/// `FlexAttention`'s modifier subgraphs must keep the scores' shape; one that does not is
/// an error naming it.
#[test]
fn flex_attention_modifiers_keep_the_shape() {
    let mut m = model(
        26,
        GraphProto {
            name: "g".into(),
            input: ["q", "k", "v"]
                .iter()
                .map(|n| value(n, data_type::FLOAT, &[1, 2, 3, 4]))
                .collect(),
            output: vec![value("y", data_type::FLOAT, &[1, 2, 3, 4])],
            ..Default::default()
        },
    );
    m.opset_import.push(smelt::onnx::proto::OperatorSetIdProto {
        domain: "ai.onnx.preview".into(),
        version: 1,
    });
    // score_mod: the sum over the keys, [1, 2, 3, 1] instead of [1, 2, 3, 3]
    let axes = TensorProto {
        name: "axes".into(),
        data_type: data_type::INT64,
        dims: vec![1],
        int64_data: vec![3],
        ..Default::default()
    };
    let sub = GraphProto {
        name: "score_mod".into(),
        node: vec![node("ReduceSum", "s", &["scores", "axes"], &["out"])],
        input: vec![value("scores", data_type::FLOAT, &[1, 2, 3, 3])],
        output: vec![value("out", data_type::FLOAT, &[1, 2, 3, 1])],
        initializer: vec![axes],
        ..Default::default()
    };
    let mut n = node("FlexAttention", "flex", &["q", "k", "v"], &["y"]);
    n.domain = "ai.onnx.preview".into();
    n.attribute.push(AttributeProto {
        name: "score_mod".into(),
        r#type: attribute_type::GRAPH,
        g: Some(sub),
        ..Default::default()
    });
    m.graph.as_mut().unwrap().node = vec![n];
    let e = import_error(&m, None);
    assert!(
        e.contains("score_mod must keep the shape [1, 2, 3, 3], gives [1, 2, 3, 1]"),
        "{e}"
    );
}

#[test]
fn attributes_of_the_wrong_kind_are_errors() {
    let mut m = relu_model();
    let g = m.graph.as_mut().unwrap();
    let mut n = node("Flatten", "f", &["x"], &["y"]);
    n.attribute.push(AttributeProto {
        name: "axis".into(),
        r#type: attribute_type::STRING,
        s: b"one".to_vec(),
        ..Default::default()
    });
    g.node = vec![n];
    g.output = vec![value("y", data_type::FLOAT, &[2, 3])];
    let e = import_error(&m, None);
    assert!(e.contains("attribute 'axis' should be an integer"), "{e}");
}

/// A count computed from an input's value (here `Range`'s limit, `n + 1`) is computed at
/// import from the value given; the import is specialized to it, and binding another value
/// is an error.
#[test]
fn values_computed_from_inputs_specialize_the_import() {
    let scalar = |name: &str, v: i64| TensorProto {
        name: name.into(),
        data_type: data_type::INT64,
        int64_data: vec![v],
        ..Default::default()
    };
    let m = model(
        17,
        GraphProto {
            name: "g".into(),
            node: vec![
                node("Add", "a", &["n", "one"], &["limit"]),
                node("Range", "r", &["zero", "limit", "one"], &["y"]),
            ],
            initializer: vec![scalar("zero", 0), scalar("one", 1)],
            input: vec![value("n", data_type::INT64, &[])],
            output: vec![ValueInfoProto {
                name: "y".into(),
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    let model = smelt::onnx::from_bytes(&m.encode_to_vec(), None).unwrap();
    let three = Tensor::from_vec(vec![3i64], &[]).unwrap();
    let imp = model.import_for(&[("n", &three)]).unwrap();
    assert_eq!(imp.specialized.len(), 1);
    let y = smelt::runtime::interp::run_positional(
        &imp.graph,
        &imp.bind(&[("n", three.clone())]).unwrap(),
    )
    .unwrap();
    assert_eq!(y[0].to_vec::<i64>().unwrap(), [0, 1, 2, 3]);
    let five = Tensor::from_vec(vec![5i64], &[]).unwrap();
    let e = imp.bind(&[("n", five)]).unwrap_err().to_string();
    assert!(e.contains("import it again"), "{e}");
    // without the value, the import says what it needs
    let e = model.import(&[]).unwrap_err().to_string();
    assert!(
        e.contains("must be known when the model is imported"),
        "{e}"
    );
}

/// Operands of the wrong rank for what an op reads are errors, not out-of-range indexing.
#[test]
fn operands_of_the_wrong_rank_are_errors() {
    let vector = TensorProto {
        name: "v".into(),
        dims: vec![3],
        data_type: data_type::FLOAT,
        float_data: vec![1.0; 3],
        ..Default::default()
    };
    for (op, needle) in [("Gemm", "must be 2-D"), ("LSTM", "must be 3-D")] {
        let mut m = relu_model();
        let g = m.graph.as_mut().unwrap();
        g.initializer.push(vector.clone());
        g.node = vec![node(op, "n", &["x", "v", "v"], &["y"])];
        let e = import_error(&m, None);
        assert!(e.contains(needle), "{op}: {e}");
    }
}
