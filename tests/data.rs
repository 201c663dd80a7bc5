//! Data loading: epochs cover every sample once, seeded shuffling, drop_last, workers that
//! give the same batches in the same order, error propagation, BackgroundGenerator.

use smelt::data::{BackgroundGenerator, DataLoader, Dataset, TensorDataset, collate};
use smelt::{DType, Error, Result, Tensor, bail};

/// Sample i is (x = [i, 10·i], y = i).
fn dataset(n: usize) -> TensorDataset {
    let x: Vec<f32> = (0..n).flat_map(|i| [i as f32, 10.0 * i as f32]).collect();
    let y: Vec<i64> = (0..n as i64).collect();
    TensorDataset::new(vec![
        Tensor::from_vec(x, &[n, 2]).unwrap(),
        Tensor::from_vec(y, &[n]).unwrap(),
    ])
    .unwrap()
}

fn epoch<D: Dataset>(loader: &mut DataLoader<D>) -> Vec<Vec<i64>> {
    loader
        .iter()
        .unwrap()
        .map(|b| {
            let b = b.unwrap();
            // Fields stay aligned: x[:, 0] is the label.
            let x = b[0].to_f64_vec();
            let y = b[1].to_i64_vec();
            assert_eq!(b[0].shape(), &[y.len(), 2]);
            for (k, &l) in y.iter().enumerate() {
                assert_eq!(x[2 * k], l as f64);
                assert_eq!(x[2 * k + 1], 10.0 * l as f64);
            }
            y
        })
        .collect()
}

#[test]
fn in_order_batches_cover_everything_once() {
    for (n, bs) in [(10, 3), (7, 7), (1, 4), (12, 4), (4097, 512)] {
        let mut loader = DataLoader::new(dataset(n), bs).unwrap();
        let batches = epoch(&mut loader);
        assert_eq!(batches.len(), loader.len());
        assert_eq!(batches.len(), n.div_ceil(bs));
        let flat: Vec<i64> = batches.concat();
        assert_eq!(flat, (0..n as i64).collect::<Vec<_>>());
    }
}

#[test]
fn shuffle_is_a_seeded_permutation_per_epoch() {
    let n = 50;
    let mut a = DataLoader::new(dataset(n), 8).unwrap().shuffle(42);
    let mut b = DataLoader::new(dataset(n), 8).unwrap().shuffle(42);
    let mut c = DataLoader::new(dataset(n), 8).unwrap().shuffle(43);
    let a1: Vec<i64> = epoch(&mut a).concat();
    let a2: Vec<i64> = epoch(&mut a).concat();
    let b1: Vec<i64> = epoch(&mut b).concat();
    let b2: Vec<i64> = epoch(&mut b).concat();
    let c1: Vec<i64> = epoch(&mut c).concat();
    for e in [&a1, &a2, &c1] {
        let mut s = e.clone();
        s.sort();
        assert_eq!(s, (0..n as i64).collect::<Vec<_>>());
    }
    assert_eq!(a1, b1);
    assert_eq!(a2, b2);
    assert_ne!(a1, a2);
    assert_ne!(a1, c1);
    assert_ne!(a1, (0..n as i64).collect::<Vec<_>>());
}

#[test]
fn drop_last_drops_the_short_batch() {
    let mut loader = DataLoader::new(dataset(10), 3).unwrap().drop_last(true);
    assert_eq!(loader.len(), 3);
    let batches = epoch(&mut loader);
    assert_eq!(batches, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]]);
    let mut exact = DataLoader::new(dataset(9), 3).unwrap().drop_last(true);
    assert_eq!(epoch(&mut exact).len(), 3);
    let mut tiny = DataLoader::new(dataset(2), 3).unwrap().drop_last(true);
    assert!(tiny.is_empty());
    assert!(epoch(&mut tiny).is_empty());
}

#[test]
fn workers_match_the_single_threaded_loader() {
    for workers in [1, 2, 3, 8] {
        let mut plain = DataLoader::new(dataset(101), 6).unwrap().shuffle(9);
        let mut threaded = DataLoader::new(dataset(101), 6)
            .unwrap()
            .shuffle(9)
            .num_workers(workers)
            .prefetch_factor(1)
            .pin_memory(true);
        assert!(threaded.is_pin_memory());
        for _ in 0..2 {
            assert_eq!(epoch(&mut plain), epoch(&mut threaded));
        }
    }
}

#[test]
fn stopping_early_releases_the_workers() {
    let mut loader = DataLoader::new(dataset(1000), 2).unwrap().num_workers(4);
    let first: Vec<_> = loader.iter().unwrap().take(3).collect();
    assert_eq!(first.len(), 3);
    // A later epoch starts fresh.
    assert_eq!(epoch(&mut loader).concat().len(), 1000);
}

/// A dataset whose sample 5 cannot be read.
struct Flaky;

impl Dataset for Flaky {
    fn len(&self) -> usize {
        9
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        if index == 5 {
            bail!(Io, "sample {index} is unreadable");
        }
        Ok(vec![Tensor::scalar(index as i64)])
    }
}

#[test]
fn dataset_errors_reach_the_consumer() {
    for workers in [0, 1, 3] {
        let mut loader = DataLoader::new(Flaky, 2).unwrap().num_workers(workers);
        let results: Vec<Result<Vec<Tensor>>> = loader.iter().unwrap().collect();
        assert_eq!(results.len(), 5);
        for (i, r) in results.iter().enumerate() {
            if i == 2 {
                assert_eq!(
                    r.as_ref().err(),
                    Some(&Error::Io("sample 5 is unreadable".into()))
                );
            } else {
                let b = r.as_ref().unwrap();
                assert_eq!(b[0].to_i64_vec()[0], 2 * i as i64);
            }
        }
    }
}

#[test]
fn tensor_dataset_and_collate_checks() {
    let e = TensorDataset::new(vec![
        Tensor::zeros(&[3, 2], DType::F32),
        Tensor::zeros(&[4], DType::F32),
    ])
    .err()
    .unwrap();
    assert_eq!(e.to_string(), "Size mismatch between tensors");
    assert!(TensorDataset::new(vec![]).is_err());
    assert!(TensorDataset::new(vec![Tensor::scalar(1.0)]).is_err());
    let d = dataset(3);
    assert!(d.get(3).is_err());
    assert_eq!(d.get(2).unwrap()[0].to_f64_vec(), vec![2.0, 20.0]);
    assert!(DataLoader::new(dataset(3), 0).is_err());
    assert!(collate(&[]).is_err());
    let ragged = [vec![Tensor::scalar(1.0)], vec![]];
    assert!(collate(&ragged).is_err());
    // Samples of different shapes cannot be stacked.
    let mixed = [
        vec![Tensor::zeros(&[2], DType::F32)],
        vec![Tensor::zeros(&[3], DType::F32)],
    ];
    assert!(collate(&mixed).is_err());
    // An empty dataset has no batches.
    let empty = TensorDataset::new(vec![Tensor::zeros(&[0, 2], DType::F32)]).unwrap();
    let mut loader = DataLoader::new(empty, 4).unwrap().num_workers(2);
    assert_eq!(loader.iter().unwrap().count(), 0);
    // Non-contiguous source tensors.
    let x = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0], &[2, 3])
        .unwrap()
        .t()
        .unwrap();
    let mut loader = DataLoader::new(TensorDataset::new(vec![x]).unwrap(), 2).unwrap();
    let b = loader.iter().unwrap().next().unwrap().unwrap();
    assert_eq!(b[0].to_f64_vec(), vec![0.0, 3.0, 1.0, 4.0]);
}

#[test]
fn background_generator_preserves_order() {
    let items: Vec<u32> = BackgroundGenerator::new(0..1000u32, 4).collect();
    assert_eq!(items, (0..1000).collect::<Vec<_>>());
    // Wrapping a loader epoch, as the DataLoaderX recipe does.
    let mut loader = DataLoader::new(dataset(20), 6).unwrap().shuffle(1);
    let mut again = DataLoader::new(dataset(20), 6).unwrap().shuffle(1);
    let pre: Vec<Vec<i64>> = BackgroundGenerator::new(loader.iter().unwrap(), 2)
        .map(|b| b.unwrap()[1].to_i64_vec())
        .collect();
    assert_eq!(pre, epoch(&mut again));
    // Dropping it early stops the producer.
    let mut it = BackgroundGenerator::new(0..u64::MAX, 1);
    assert_eq!(it.next(), Some(0));
    drop(it);
}
