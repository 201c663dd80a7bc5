//! ONNX lowerings the backend node tests cover thinly: `TfIdfVectorizer`'s weightings
//! (`TF`, `IDF`, `TFIDF`) on a hand-counted input (the node tests have `TF` only), and `Det`
//! against the Leibniz formula on random, singular and pivoting matrices.

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

/// `y = Det(x)` for f64 `x` of `shape`.
fn det_model(shape: &[usize]) -> smelt::onnx::Model {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let m = model(
        11,
        GraphProto {
            name: "g".into(),
            node: vec![node("Det", "d", &["x"], &["y"])],
            input: vec![value("x", data_type::DOUBLE, &dims)],
            output: vec![value("y", data_type::DOUBLE, &dims[..dims.len() - 2])],
            ..Default::default()
        },
    );
    smelt::onnx::from_bytes(&m.encode_to_vec(), None).unwrap()
}

/// The determinant as the sum over permutations (exact enough in f64 for small sides).
fn leibniz(a: &[f64], n: usize) -> f64 {
    fn perms(k: usize, p: &mut Vec<usize>, used: &mut Vec<bool>, out: &mut Vec<Vec<usize>>) {
        if p.len() == k {
            out.push(p.clone());
            return;
        }
        for i in 0..k {
            if !used[i] {
                used[i] = true;
                p.push(i);
                perms(k, p, used, out);
                p.pop();
                used[i] = false;
            }
        }
    }
    let mut all = Vec::new();
    perms(n, &mut Vec::new(), &mut vec![false; n], &mut all);
    all.iter()
        .map(|p| {
            let inversions = (0..n)
                .flat_map(|i| (i + 1..n).map(move |j| (i, j)))
                .filter(|&(i, j)| p[i] > p[j])
                .count();
            let s = if inversions % 2 == 0 { 1.0 } else { -1.0 };
            s * (0..n).map(|i| a[i * n + p[i]]).product::<f64>()
        })
        .sum()
}

#[test]
fn det_matches_the_leibniz_formula() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % 2001) as f64 / 1000.0 - 1.0
    };
    for n in 1..=5 {
        let batch = 3;
        let mut v: Vec<f64> = (0..batch * n * n).map(|_| next()).collect();
        if n >= 2 {
            // a singular matrix (two equal rows) and one whose first pivot is 0
            let (a, b) = v.split_at_mut(n * n);
            a.copy_within(..n, n);
            b[0] = 0.0;
        }
        let x = Tensor::from_vec(v.clone(), &[batch, n, n]).unwrap();
        let m = det_model(&[batch, n, n]);
        let imp = m.import_for(&[("x", &x)]).unwrap();
        let inputs = imp.bind(&[("x", x.clone())]).unwrap();
        let y = smelt::runtime::interp::run_positional(&imp.graph, &inputs).unwrap();
        let got = y[0].to_vec::<f64>().unwrap();
        for (i, g) in got.iter().enumerate() {
            let want = leibniz(&v[i * n * n..(i + 1) * n * n], n);
            assert!(
                (g - want).abs() <= 1e-12 * want.abs().max(1.0),
                "{n}x{n} #{i}: {g} vs {want}"
            );
        }
    }
    // a permutation matrix: one swap, determinant -1
    let x = Tensor::from_vec(vec![0.0, 1.0, 1.0, 0.0], &[2, 2]).unwrap();
    let imp = det_model(&[2, 2]).import_for(&[("x", &x)]).unwrap();
    let y =
        smelt::runtime::interp::run_positional(&imp.graph, &imp.bind(&[("x", x.clone())]).unwrap())
            .unwrap();
    assert_eq!(y[0].to_vec::<f64>().unwrap(), vec![-1.0]);
}
