//! ONNX `TfIdfVectorizer`'s weightings (`TF`, `IDF`, `TFIDF`) on a hand-counted input: the
//! ONNX backend node tests cover `TF` only.

use prost::Message;
use smelt::Tensor;
use smelt::onnx::proto::{AttributeProto, GraphProto, attribute_type, data_type};

mod common;
use common::onnx_protos::{model, node, value};

fn ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::INTS,
        ints: v.to_vec(),
        ..Default::default()
    }
}

/// 1-grams `2`, `3` and the 2-gram `(5, 4)` to columns 0, 1, 2, lengths 1 to 2, no skips.
fn vectorizer(mode: &str, weights: Option<&[f32]>, c: i64) -> smelt::onnx::Model {
    let mut n = node("TfIdfVectorizer", "v", &["x"], &["y"]);
    n.attribute = vec![
        ints("pool_int64s", &[2, 3, 5, 4]),
        ints("ngram_counts", &[0, 2]),
        ints("ngram_indexes", &[0, 1, 2]),
        AttributeProto {
            name: "min_gram_length".into(),
            r#type: attribute_type::INT,
            i: 1,
            ..Default::default()
        },
        AttributeProto {
            name: "max_gram_length".into(),
            r#type: attribute_type::INT,
            i: 2,
            ..Default::default()
        },
        AttributeProto {
            name: "mode".into(),
            r#type: attribute_type::STRING,
            s: mode.as_bytes().to_vec(),
            ..Default::default()
        },
    ];
    if let Some(w) = weights {
        n.attribute.push(AttributeProto {
            name: "weights".into(),
            r#type: attribute_type::FLOATS,
            floats: w.to_vec(),
            ..Default::default()
        });
    }
    let m = model(
        9,
        GraphProto {
            name: "g".into(),
            node: vec![n],
            input: vec![value("x", data_type::INT64, &[c])],
            output: vec![value("y", data_type::FLOAT, &[3])],
            ..Default::default()
        },
    );
    smelt::onnx::from_bytes(&m.encode_to_vec(), None).unwrap()
}

fn run(m: &smelt::onnx::Model, tokens: &[i64]) -> Vec<f32> {
    let x = Tensor::from_slice(tokens, &[tokens.len()]).unwrap();
    let imp = m.import_for(&[("x", &x)]).unwrap();
    let inputs = imp.bind(&[("x", x.clone())]).unwrap();
    let y = smelt::runtime::interp::run_positional(&imp.graph, &inputs).unwrap();
    y[0].to_vec::<f32>().unwrap()
}

#[test]
fn weightings_scale_the_counted_ngrams() {
    // 2 three times, 3 once, (5, 4) at positions 2 and 5
    let tokens = [2, 3, 5, 4, 2, 5, 4, 2];
    let w: &[f32] = &[0.5, 2.0, 0.25];
    let c = tokens.len() as i64;
    assert_eq!(
        run(&vectorizer("TF", None, c), &tokens),
        vec![3.0, 1.0, 2.0]
    );
    assert_eq!(
        run(&vectorizer("TFIDF", Some(w), c), &tokens),
        vec![1.5, 2.0, 0.5]
    );
    assert_eq!(
        run(&vectorizer("IDF", Some(w), c), &tokens),
        vec![0.5, 2.0, 0.25]
    );
    assert_eq!(
        run(&vectorizer("IDF", None, c), &tokens),
        vec![1.0, 1.0, 1.0]
    );
    // nothing found: zeros in every mode
    let none = [7, 7, 7, 7, 7, 7, 7, 7];
    assert_eq!(run(&vectorizer("IDF", Some(w), c), &none), vec![0.0; 3]);
    let e = vectorizer("BM25", None, c)
        .import(&[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("mode 'BM25'"), "{e}");
}
