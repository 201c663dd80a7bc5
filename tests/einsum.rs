//! einsum against a brute-force f64 sum over every assignment of the subscripts, and against
//! the permute/matmul/sum it stands for.

use proptest::prelude::*;
use smelt::ir::op::Op;
use smelt::runtime::apply;
use smelt::{DType, Tensor};
use std::collections::BTreeMap;

fn t(data: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    let x = Tensor::from_vec(data.to_vec(), shape).unwrap();
    apply(Op::To { dtype }, &[&x]).unwrap()
}

fn vals(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 5 + seed * 3) % 7) as f64 - 3.0)
        .collect()
}

/// Brute-force einsum for letter-only equations with an explicit `->`.
fn reference(eq: &str, ops: &[(&[f64], &[usize])]) -> (Vec<f64>, Vec<usize>) {
    let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = eq.split_once("->").unwrap();
    let terms: Vec<&str> = lhs.split(',').collect();
    let mut size: BTreeMap<char, usize> = BTreeMap::new();
    for (term, (_, shape)) in terms.iter().zip(ops) {
        for (c, &s) in term.chars().zip(shape.iter()) {
            let e = size.entry(c).or_insert(s);
            *e = (*e).max(s);
        }
    }
    let labels: Vec<char> = size.keys().copied().collect();
    let out_shape: Vec<usize> = rhs.chars().map(|c| size[&c]).collect();
    let mut out = vec![0.0; out_shape.iter().product()];
    let total: usize = labels.iter().map(|c| size[c]).product();
    for mut p in 0..total {
        let mut val: BTreeMap<char, usize> = BTreeMap::new();
        for c in labels.iter().rev() {
            val.insert(*c, p % size[c]);
            p /= size[c];
        }
        let mut prod = 1.0;
        for (term, (data, shape)) in terms.iter().zip(ops) {
            // size-1 dims broadcast: they always read index 0
            let off = term
                .chars()
                .zip(shape.iter())
                .fold(0, |acc, (c, &s)| acc * s + if s == 1 { 0 } else { val[&c] });
            prod *= data[off];
        }
        let o = rhs
            .chars()
            .zip(&out_shape)
            .fold(0, |acc, (c, &s)| acc * s + val[&c]);
        out[o] += prod;
    }
    (out, out_shape)
}

fn check(eq: &str, shapes: &[&[usize]], dtype: DType) {
    let datas: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| vals(s.iter().product(), i))
        .collect();
    let ops: Vec<(&[f64], &[usize])> = datas
        .iter()
        .zip(shapes)
        .map(|(d, s)| (&d[..], *s))
        .collect();
    let (want, shape) = reference(eq, &ops);
    let ts: Vec<Tensor> = datas
        .iter()
        .zip(shapes)
        .map(|(d, s)| t(d, s, dtype))
        .collect();
    let refs: Vec<&Tensor> = ts.iter().collect();
    let got = Tensor::einsum(eq, &refs).unwrap_or_else(|e| panic!("{eq}: {e}"));
    assert_eq!(got.shape(), &shape[..], "{eq}");
    assert_eq!(got.dtype(), dtype, "{eq}");
    assert_eq!(got.to_f64_vec(), want, "{eq} {dtype}");
    for x in &ts {
        assert!(
            !got.shares_storage(x),
            "{eq}: einsum must not return a view"
        );
    }
}

#[test]
fn equations_match_brute_force() {
    let cases: &[(&str, &[&[usize]])] = &[
        ("ij,jk->ik", &[&[2, 3], &[3, 4]]),
        ("ij,jk->ki", &[&[2, 3], &[3, 4]]),
        ("bij,bjk->bik", &[&[2, 2, 3], &[2, 3, 2]]),
        ("ii->i", &[&[3, 3]]),
        ("ii->", &[&[3, 3]]),
        ("iij->j", &[&[2, 2, 3]]),
        ("ij->", &[&[2, 3]]),
        ("ij->ji", &[&[2, 3]]),
        ("ij->j", &[&[2, 3]]),
        ("i,j->ij", &[&[2], &[3]]),
        ("i,i->", &[&[4], &[4]]),
        ("i,i->i", &[&[4], &[1]]),
        ("ij,j->i", &[&[2, 3], &[3]]),
        ("ijk,ikl,lm->jm", &[&[2, 3, 2], &[2, 2, 3], &[3, 2]]),
        ("abc,cd,ad->b", &[&[2, 3, 2], &[2, 2], &[2, 2]]),
        ("ij,kl->", &[&[2, 2], &[3, 1]]),
        ("iji,j->ij", &[&[2, 3, 2], &[3]]),
        (" i j , j k -> i k ", &[&[2, 3], &[3, 2]]),
        ("->", &[&[]]),
        (",i->i", &[&[], &[3]]),
    ];
    for dt in [DType::F32, DType::F64, DType::I64, DType::F16, DType::BF16] {
        for (eq, shapes) in cases {
            check(eq, shapes, dt);
        }
    }
}

#[test]
fn implicit_output_and_ellipsis() {
    let a = t(&vals(6, 0), &[2, 3], DType::F32);
    let b = t(&vals(12, 1), &[3, 4], DType::F32);
    let ex = Tensor::einsum("ij,jk->ik", &[&a, &b]).unwrap();
    let im = Tensor::einsum("ij,jk", &[&a, &b]).unwrap();
    assert_eq!(im.to_f64_vec(), ex.to_f64_vec());
    // implicit output: sorted letters that appear once, so "ba" is a transpose
    let tr = Tensor::einsum("ba", &[&a]).unwrap();
    assert_eq!(tr.shape(), &[3, 2]);
    assert_eq!(
        tr.to_f64_vec(),
        a.t().unwrap().contiguous().unwrap().to_f64_vec()
    );
    assert_eq!(
        Tensor::einsum("ii", &[&a.narrow(1, 0, 2).unwrap()])
            .unwrap()
            .shape(),
        &[] as &[usize]
    );
    // ellipsis with broadcasting batch dims
    let x = t(&vals(2 * 2 * 3, 0), &[2, 1, 2, 3], DType::F64)
        .expand(&[2, 1, 2, 3])
        .unwrap();
    let y = t(&vals(4 * 3 * 2, 2), &[4, 3, 2], DType::F64);
    let e = Tensor::einsum("...ij,...jk->...ik", &[&x, &y]).unwrap();
    assert_eq!(e.shape(), &[2, 4, 2, 2]);
    let m = x.matmul(&y).unwrap();
    assert_eq!(e.to_f64_vec(), m.to_f64_vec());
    // implicit output keeps the ellipsis dims first
    let e2 = Tensor::einsum("...ij,...jk", &[&x, &y]).unwrap();
    assert_eq!(e2.to_f64_vec(), m.to_f64_vec());
    // explicit output without the ellipsis sums its dims away
    let s = Tensor::einsum("i...->i", &[&y]).unwrap();
    assert_eq!(
        s.to_f64_vec(),
        y.sum_dim(&[1, 2], false).unwrap().to_f64_vec()
    );
    // transposed and sliced views as operands
    let at = t(&vals(6, 3), &[3, 2], DType::F32).t().unwrap();
    let bs = t(&vals(24, 4), &[3, 8], DType::F32)
        .slice(1, Some(0), None, 2)
        .unwrap();
    let got = Tensor::einsum("ij,jk->ik", &[&at, &bs]).unwrap();
    assert_eq!(got.to_f64_vec(), at.matmul(&bs).unwrap().to_f64_vec());
}

#[test]
fn einsum_errors() {
    let a = t(&vals(4, 0), &[2, 2], DType::F32);
    let b = t(&vals(12, 0), &[3, 4], DType::F32);
    let e = |eq: &str, ops: &[&Tensor]| Tensor::einsum(eq, ops).unwrap_err().to_string();
    assert_eq!(
        e("ij,jk->ik", &[&a, &b]),
        "einsum(): subscript j has size 3 for operand 1 which does not broadcast with previously seen size 2"
    );
    assert_eq!(
        e("ij,j$->i", &[&a, &a]),
        "einsum(): invalid subscript given at index 4 in the equation string, subscripts must be in [a-zA-Z]"
    );
    assert!(e("ij,jk->ik", &[&a]).contains("fewer operands"));
    assert!(e("ij->ik", &[&a]).contains("output subscript k does not appear"));
    assert!(e("ij->ii", &[&a]).contains("output subscript i appears more than once"));
    assert!(e("", &[]).contains("einsum()"));
    // empty operands: a contraction over nothing is zeros; an empty result has no elements
    let z = Tensor::zeros(&[2, 0], DType::F32);
    let z2 = Tensor::zeros(&[0, 3], DType::F32);
    let zz = Tensor::einsum("ij,jk->ik", &[&z, &z2]).unwrap();
    assert_eq!(zz.shape(), &[2, 3]);
    assert_eq!(zz.try_to_f64_vec().unwrap(), vec![0.0; 6]);
    let e0 = Tensor::einsum("ij,ij->ij", &[&z, &z]).unwrap();
    assert_eq!(e0.shape(), &[2, 0]);
    assert_eq!(e0.try_to_f64_vec().unwrap(), Vec::<f64>::new());
    let d = Tensor::zeros(&[0, 4], DType::F64);
    let summed = Tensor::einsum("ij->j", &[&d]).unwrap();
    assert_eq!(summed.try_to_f64_vec().unwrap(), vec![0.0; 4]);
    let i = t(&vals(4, 0), &[2, 2], DType::I64);
    assert!(e("ij,jk->ik", &[&a, &i]).contains("same dtype"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// A batched contraction equals permute + matmul of the same operands.
    #[test]
    fn batched_contraction_is_matmul(b in 1usize..3, i in 1usize..4, j in 1usize..4, k in 1usize..4) {
        let x = t(&vals(b * i * j, 1), &[b, i, j], DType::F64);
        let y = t(&vals(b * k * j, 2), &[b, k, j], DType::F64);
        let got = Tensor::einsum("bij,bkj->bik", &[&x, &y]).unwrap();
        let want = x.matmul(&y.transpose(1, 2).unwrap()).unwrap();
        prop_assert_eq!(got.shape(), want.shape());
        prop_assert_eq!(got.to_f64_vec(), want.to_f64_vec());
        let s = Tensor::einsum("bij->j", &[&x]).unwrap();
        prop_assert_eq!(s.to_f64_vec(), x.sum_dim(&[0, 1], false).unwrap().to_f64_vec());
    }

    /// Random three-operand chains against the brute-force reference.
    #[test]
    fn random_chains_match_brute_force(sizes in prop::collection::vec(1usize..4, 4), out_mask in 0u8..16) {
        let (p, q, r, s) = (sizes[0], sizes[1], sizes[2], sizes[3]);
        let out: String = "pqrs".chars().enumerate().filter(|(n, _)| out_mask >> n & 1 == 1).map(|(_, c)| c).collect();
        let eq = format!("pq,qrs,sp->{out}");
        check(&eq, &[&[p, q], &[q, r, s], &[s, p]], DType::F64);
    }
}
