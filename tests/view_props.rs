//! Random chains of views against an index model written from the ops' definitions: the
//! model keeps, for every element of the view in row-major order, the flat index of the
//! original element it shows.

use proptest::prelude::*;
use smelt::Tensor;
use smelt::runtime::storage::allocation_count;

/// The flat index into the original data of each element of a view, in row-major order.
#[derive(Clone, Debug)]
struct Model {
    shape: Vec<usize>,
    idx: Vec<usize>,
}

fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut out = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        out[d] = flat % shape[d];
        flat /= shape[d];
    }
    out
}

fn ravel(ix: &[usize], shape: &[usize]) -> usize {
    ix.iter().zip(shape).fold(0, |acc, (&i, &s)| acc * s + i)
}

impl Model {
    fn new(shape: &[usize]) -> Model {
        Model {
            shape: shape.to_vec(),
            idx: (0..shape.iter().product()).collect(),
        }
    }
    /// The view of shape `shape` whose element at `out` is this view's element at `f(out)`.
    fn map(&self, shape: Vec<usize>, f: impl Fn(&[usize]) -> Vec<usize>) -> Model {
        let n: usize = shape.iter().product();
        let idx = (0..n)
            .map(|k| self.idx[ravel(&f(&unravel(k, &shape)), &self.shape)])
            .collect();
        Model { shape, idx }
    }
    /// Same elements in the same order, another shape (view, reshape, flatten).
    fn reshaped(&self, shape: Vec<usize>) -> Model {
        Model {
            shape,
            idx: self.idx.clone(),
        }
    }
}

/// One step of a chain: an op kind and three raw numbers its parameters are drawn from.
type Step = (u8, usize, usize, usize);

/// What a step did: the result, its model, and whether it must be a view (no allocation).
struct Applied {
    t: Tensor,
    m: Model,
    pure_view: bool,
}

/// Python's clamping of a slice bound.
fn clamp_bound(v: Option<i64>, n: usize, default: usize) -> usize {
    match v {
        None => default,
        Some(v) if v < 0 => (v + n as i64).max(0) as usize,
        Some(v) => (v as usize).min(n),
    }
}

fn bound(raw: usize) -> Option<i64> {
    match raw % 12 {
        0 => None,
        r => Some(r as i64 - 6),
    }
}

/// A permutation of `0..n` drawn from `seed`.
fn permutation(n: usize, mut seed: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        p.swap(i, (seed >> 33) % (i + 1));
    }
    p
}

/// A shape with `numel` elements drawn from `a`, `b`, as sizes with possibly one -1.
fn reshape_target(numel: usize, a: usize, b: usize) -> (Vec<i64>, Vec<usize>) {
    if numel == 0 {
        let k = 1 + a % 3;
        return match b % 3 {
            0 => (vec![0], vec![0]),
            1 => (vec![0, k as i64], vec![0, k]),
            _ => (vec![k as i64, 0], vec![k, 0]),
        };
    }
    let divisors: Vec<usize> = (1..=numel).filter(|&d| numel.is_multiple_of(d)).collect();
    let d = divisors[a % divisors.len()];
    let (n, d_i, q) = (numel as i64, d as i64, (numel / d) as i64);
    match b % 4 {
        0 => (vec![n], vec![numel]),
        1 => (vec![d_i, q], vec![d, numel / d]),
        2 => (vec![d_i, -1], vec![d, numel / d]),
        _ => (vec![1, -1, d_i], vec![1, numel / d, d]),
    }
}

fn signed_dim(d: usize, n: usize, negative: bool) -> i64 {
    if negative {
        d as i64 - n.max(1) as i64
    } else {
        d as i64
    }
}

/// Applies one step, or returns `None` when it does not fit the current shape.
fn apply(t: &Tensor, m: &Model, (kind, a, b, c): Step) -> Option<Applied> {
    let n = m.shape.len();
    let sh = &m.shape;
    let view = |t: Tensor, m: Model| {
        Some(Applied {
            t,
            m,
            pure_view: true,
        })
    };
    match kind % 13 {
        0 if n > 0 => {
            let (d0, d1) = (a % n, b % n);
            let r = t
                .transpose(signed_dim(d0, n, c % 2 == 1), d1 as i64)
                .unwrap();
            let mut shape = sh.clone();
            shape.swap(d0, d1);
            view(
                r,
                m.map(shape, |o| {
                    let mut i = o.to_vec();
                    i.swap(d0, d1);
                    i
                }),
            )
        }
        1 => {
            let p = permutation(n, a);
            let dims: Vec<i64> = p.iter().map(|&d| signed_dim(d, n, b % 2 == 1)).collect();
            let r = t.permute(&dims).unwrap();
            let shape = p.iter().map(|&d| sh[d]).collect();
            view(
                r,
                m.map(shape, |o| {
                    let mut i = vec![0; n];
                    for (k, &d) in p.iter().enumerate() {
                        i[d] = o[k];
                    }
                    i
                }),
            )
        }
        2 if n > 0 => {
            let d = a % n;
            let start = b % (sh[d] + 1);
            let len = c % (sh[d] - start + 1);
            let r = t.narrow(d as i64, start as i64, len as i64).unwrap();
            let mut shape = sh.clone();
            shape[d] = len;
            view(
                r,
                m.map(shape, |o| {
                    let mut i = o.to_vec();
                    i[d] += start;
                    i
                }),
            )
        }
        3 if n > 0 && sh[a % n] > 0 => {
            let d = a % n;
            let index = b % sh[d];
            let arg = if c % 2 == 1 {
                index as i64 - sh[d] as i64
            } else {
                index as i64
            };
            let r = t.select(signed_dim(d, n, c % 4 >= 2), arg).unwrap();
            let mut shape = sh.clone();
            shape.remove(d);
            view(
                r,
                m.map(shape, |o| {
                    let mut i = o.to_vec();
                    i.insert(d, index);
                    i
                }),
            )
        }
        4 if n > 0 => {
            let d = a % n;
            let step = 1 + b % 3;
            let (start, end) = (bound(c), bound(c / 12 + b / 3));
            let s = clamp_bound(start, sh[d], 0);
            let e = clamp_bound(end, sh[d], sh[d]);
            let len = if e > s { (e - s).div_ceil(step) } else { 0 };
            let r = t.slice(d as i64, start, end, step as i64).unwrap();
            let mut shape = sh.clone();
            shape[d] = len;
            view(
                r,
                m.map(shape, |o| {
                    let mut i = o.to_vec();
                    i[d] = s + o[d] * step;
                    i
                }),
            )
        }
        5 => {
            // size-1 dims grow to 0..4; others keep their size (as -1 or written out)
            let lead = c % 2;
            let mut target: Vec<i64> = vec![(a % 3) as i64; lead];
            for (k, &s) in sh.iter().enumerate() {
                let seed = (b >> (2 * k)) % 4;
                target.push(if s == 1 {
                    seed as i64
                } else if seed.is_multiple_of(2) {
                    -1
                } else {
                    s as i64
                });
            }
            let r = t.expand(&target).unwrap();
            let shape: Vec<usize> = target
                .iter()
                .enumerate()
                .map(|(k, &s)| if s < 0 { sh[k - lead] } else { s as usize })
                .collect();
            view(
                r,
                m.map(shape, |o| {
                    (0..n)
                        .map(|d| if sh[d] == 1 { 0 } else { o[d + lead] })
                        .collect()
                }),
            )
        }
        6 => {
            let d = a % (n + 1);
            let r = t.unsqueeze(signed_dim(d, n + 1, b % 2 == 1)).unwrap();
            let mut shape = sh.clone();
            shape.insert(d, 1);
            view(
                r,
                m.map(shape, |o| {
                    let mut i = o.to_vec();
                    i.remove(d);
                    i
                }),
            )
        }
        7 => {
            let r = t.squeeze().unwrap();
            let shape = sh.iter().copied().filter(|&s| s != 1).collect();
            view(
                r,
                m.map(shape, |o| {
                    let mut it = o.iter();
                    sh.iter()
                        .map(|&s| if s == 1 { 0 } else { *it.next().unwrap() })
                        .collect()
                }),
            )
        }
        8 if n > 0 => {
            let d = a % n;
            let r = t.squeeze_dim(signed_dim(d, n, b % 2 == 1)).unwrap();
            if sh[d] != 1 {
                return view(r, m.clone());
            }
            let mut shape = sh.clone();
            shape.remove(d);
            view(
                r,
                m.map(shape, |o| {
                    let mut i = o.to_vec();
                    i.insert(d, 0);
                    i
                }),
            )
        }
        9 if n >= 2 => {
            let d1 = a % n;
            let d2 = (d1 + 1 + b % (n - 1)) % n;
            let off = (c % 5) as i64 - 2;
            let (r0, c0) = (off.min(0).unsigned_abs() as usize, off.max(0) as usize);
            let len = sh[d1].saturating_sub(r0).min(sh[d2].saturating_sub(c0));
            let r = t
                .diagonal(off, d1 as i64, signed_dim(d2, n, c % 2 == 1))
                .unwrap();
            let rest: Vec<usize> = (0..n).filter(|&d| d != d1 && d != d2).collect();
            let mut shape: Vec<usize> = rest.iter().map(|&d| sh[d]).collect();
            shape.push(len);
            view(
                r,
                m.map(shape, |o| {
                    let mut i = vec![0; n];
                    for (k, &d) in rest.iter().enumerate() {
                        i[d] = o[k];
                    }
                    i[d1] = o[n - 2] + r0;
                    i[d2] = o[n - 2] + c0;
                    i
                }),
            )
        }
        10 => {
            let (target, shape) = reshape_target(m.idx.len(), a, b);
            match t.view(&target) {
                Ok(r) => view(r, m.reshaped(shape)),
                Err(e) => {
                    assert!(
                        !t.is_contiguous(),
                        "a contiguous tensor must accept view {target:?}"
                    );
                    assert!(e.to_string().contains("view size is not compatible"), "{e}");
                    None
                }
            }
        }
        11 => {
            let (target, shape) = reshape_target(m.idx.len(), a, b);
            let viewable = t.view(&target).is_ok();
            let before = allocation_count();
            let r = t.reshape(&target).unwrap();
            if viewable {
                assert_eq!(
                    allocation_count(),
                    before,
                    "reshape copied a viewable tensor"
                );
                assert!(r.shares_storage(t));
            }
            let via_copy = t.contiguous().unwrap().view(&target).unwrap();
            assert_eq!(r.shape(), via_copy.shape());
            assert_eq!(r.to_vec::<u8>().unwrap(), via_copy.to_vec::<u8>().unwrap());
            Some(Applied {
                t: r,
                m: m.reshaped(shape),
                pure_view: false,
            })
        }
        12 => {
            let nd = n.max(1);
            let start = a % nd;
            let end = start + b % (nd - start);
            let r = t
                .flatten(signed_dim(start, n, c % 2 == 1), end as i64)
                .unwrap();
            let shape: Vec<usize> = if n == 0 {
                vec![1]
            } else {
                let mut s = sh[..start].to_vec();
                s.push(sh[start..=end].iter().product());
                s.extend_from_slice(&sh[end + 1..]);
                s
            };
            Some(Applied {
                t: r,
                m: m.reshaped(shape),
                pure_view: false,
            })
        }
        _ => None,
    }
}

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..5, 0..4)
}

fn steps_strategy() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (any::<u8>(), any::<usize>(), any::<usize>(), any::<usize>()),
        0..7,
    )
}

/// u8 elements: every original value is distinct (at most 64 of them), so an element in the
/// wrong place cannot go unnoticed.
fn original(shape: &[usize]) -> (Tensor, Vec<u8>) {
    let data: Vec<u8> = (0..shape.iter().product::<usize>())
        .map(|i| i as u8)
        .collect();
    (Tensor::from_slice(&data, shape).unwrap(), data)
}

fn check(t: &Tensor, m: &Model, data: &[u8]) {
    assert_eq!(t.shape(), &m.shape[..]);
    let expect: Vec<u8> = m.idx.iter().map(|&i| data[i]).collect();
    assert_eq!(
        t.to_vec::<u8>().unwrap(),
        expect,
        "shape {:?} strides {:?}",
        t.shape(),
        t.strides()
    );
    assert_eq!(t.contiguous().unwrap().to_vec::<u8>().unwrap(), expect);
}

/// Runs a chain; returns the final tensor and model.
fn run_chain(shape: &[usize], steps: &[Step]) -> (Tensor, Model, Vec<u8>) {
    let (x, data) = original(shape);
    let (mut t, mut m) = (x.clone(), Model::new(shape));
    let mut only_views = true;
    for &step in steps {
        let before = allocation_count();
        let Some(a) = apply(&t, &m, step) else {
            continue;
        };
        if a.pure_view {
            assert_eq!(allocation_count(), before, "step {step:?} allocated");
        }
        only_views &= a.pure_view;
        if only_views {
            assert!(
                a.t.shares_storage(&x),
                "step {step:?} left the original storage"
            );
        }
        check(&a.t, &a.m, &data);
        (t, m) = (a.t, a.m);
    }
    (t, m, data)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn view_chains_match_the_index_model(shape in shape_strategy(), steps in steps_strategy()) {
        run_chain(&shape, &steps);
    }

    #[test]
    fn repeat_tiles_by_index(shape in shape_strategy(), steps in steps_strategy(),
                             extra in 0usize..3, reps in prop::collection::vec(0usize..3, 5)) {
        let (t, m, data) = run_chain(&shape, &steps);
        let n = m.shape.len();
        let repeats: Vec<usize> = (0..n + extra).map(|i| reps[i % reps.len()]).collect();
        let lead = extra;
        let r = t.repeat(&repeats).unwrap();
        let mut padded = vec![1; lead];
        padded.extend_from_slice(&m.shape);
        let shape: Vec<usize> = padded.iter().zip(repeats).map(|(s, r)| s * r).collect();
        let tiled = m.map(shape, |o| (0..n).map(|d| o[d + lead] % m.shape[d]).collect());
        check(&r, &tiled, &data);
        if r.numel() > 0 && r.numel() != t.numel() {
            prop_assert!(!r.shares_storage(&t));
        }
    }
}

/// `repeat` always copies in PyTorch, so writing into the result never changes the input.
#[test]
fn repeat_never_aliases_its_input() {
    for (shape, reps) in [
        (vec![], vec![]),
        (vec![2, 3], vec![1, 1]),
        (vec![2], vec![1, 1]),
    ] {
        let (x, _) = original(&shape);
        let r = x.repeat(&reps).unwrap();
        assert!(!r.shares_storage(&x), "repeat({reps:?}) of shape {shape:?}");
    }
}
