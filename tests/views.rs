//! Layout and view behaviour: the seeds' cases and views against copies.

use smelt::runtime::storage::allocation_count;
use smelt::{DType, Tensor};

fn arange(n: i64, shape: &[i64]) -> Tensor {
    Tensor::arange(0, n, 1, Some(DType::F32))
        .unwrap()
        .reshape(shape)
        .unwrap()
}

#[test]
fn transpose_then_view_fails_and_contiguous_view_works() {
    let x = arange(6, &[2, 3]);
    let t = x.transpose(0, 1).unwrap();
    assert!(!t.is_contiguous());
    let e = t.view(&[6]).unwrap_err().to_string();
    assert!(e.contains("view size is not compatible"), "{e}");
    let v = t.contiguous().unwrap().view(&[6]).unwrap();
    assert_eq!(v.to_vec::<f32>().unwrap(), vec![0., 3., 1., 4., 2., 5.]);
}

#[test]
fn from_vec_is_zero_copy_and_writes_show_through() {
    let data = vec![1.0f32, 2.0, 3.0, 4.0];
    let addr = data.as_ptr() as usize;
    let t = Tensor::from_vec(data, &[2, 2]).unwrap();
    assert_eq!(t.data_ptr(), addr);
    let row = t.select(0, 1).unwrap();
    assert!(row.shares_storage(&t));
    row.with_slice_mut::<f32, _>(|s| s[0] = 30.0).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1., 2., 30., 4.]);
    drop(row);
    let back = t.into_vec::<f32>().unwrap();
    assert_eq!(back.as_ptr() as usize, addr);
}

#[test]
fn expand_allocates_nothing_and_repeat_copies() {
    let x = arange(3, &[3, 1]);
    let before = allocation_count();
    let e = x.expand(&[3, 4]).unwrap();
    assert_eq!(allocation_count(), before);
    assert_eq!(e.strides(), &[1, 0]);
    assert!(e.shares_storage(&x));
    let r = x.repeat(&[1, 4]).unwrap();
    assert_eq!(allocation_count(), before + 1);
    assert!(!r.shares_storage(&x));
    assert_eq!(r.to_vec::<f32>().unwrap(), e.to_vec::<f32>().unwrap());
    let r2 = arange(2, &[2]).repeat(&[2, 3]).unwrap();
    assert_eq!(r2.shape(), &[2, 6]);
    assert_eq!(
        r2.to_vec::<f32>().unwrap(),
        vec![0., 1., 0., 1., 0., 1., 0., 1., 0., 1., 0., 1.]
    );
}

#[test]
fn slicing_narrow_select_diagonal() {
    let x = arange(12, &[3, 4]);
    let s = x.slice(1, Some(0), None, 2).unwrap();
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![0., 2., 4., 6., 8., 10.]);
    assert_eq!(x.narrow(0, -2, 2).unwrap().to_vec::<f32>().unwrap()[0], 4.0);
    assert_eq!(
        x.diagonal(1, 0, 1).unwrap().to_vec::<f32>().unwrap(),
        vec![1., 6., 11.]
    );
    let e = x.select(0, 3).unwrap_err().to_string();
    assert_eq!(
        e,
        "select(): index 3 out of range for tensor of size [3, 4] at dimension 0"
    );
    let parts = x.chunk(3, 1).unwrap();
    assert_eq!(parts.len(), 2);
    assert_eq!(parts[1].shape(), &[3, 2]);
    assert_eq!(
        x.unbind(0).unwrap()[2].to_vec::<f32>().unwrap(),
        vec![8., 9., 10., 11.]
    );
}

/// Shape arguments take PyTorch's ints in any of Rust's spellings: sizes read from a tensor
/// (usize), bare literals with -1 (i32 by inference), and i64.
#[test]
fn shape_arguments_take_usize_and_literals() {
    let x = Tensor::arange(0.0, 6.0, 1.0, None).unwrap();
    let n = x.shape()[0];
    assert_eq!(x.view(&[n, 1]).unwrap().shape(), &[6, 1]);
    assert_eq!(x.view(&[2, -1]).unwrap().shape(), &[2, 3]);
    assert_eq!(x.reshape(&[-1i64, 2]).unwrap().shape(), &[3, 2]);
    let col = x.view(&[n, 1]).unwrap();
    assert_eq!(col.expand(&[n, 4]).unwrap().shape(), &[6, 4]);
    assert_eq!(col.expand(&[-1, 4]).unwrap().shape(), &[6, 4]);
    // a usize too large for i64 is refused by the shape rule, not wrapped
    assert!(x.view(&[usize::MAX]).is_err());
}
