//! `Display` against what PyTorch's `repr` prints with its default print options.

use half::{bf16, f16};
use smelt::{DType, Tensor, tensor};

fn f32s(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape).unwrap()
}

fn show(t: &Tensor) -> String {
    t.to_string()
}

#[test]
fn integer_valued_floats_print_with_a_trailing_dot() {
    let t = tensor![[1.0, 2.0], [3.0, 4.0]].unwrap();
    assert_eq!(show(&t), "tensor([[1., 2.],\n        [3., 4.]])");
    assert_eq!(show(&f32s(&[-1.0, 2.0], &[2])), "tensor([-1.,  2.])");
    assert_eq!(
        show(&Tensor::zeros(&[3], DType::F32)),
        "tensor([0., 0., 0.])"
    );
}

#[test]
fn fractional_floats_use_four_decimals() {
    assert_eq!(show(&f32s(&[0.1, 2.5], &[2])), "tensor([0.1000, 2.5000])");
    assert_eq!(
        show(&f32s(&[-1.5, 2.0], &[2])),
        "tensor([-1.5000,  2.0000])"
    );
    assert_eq!(show(&f32s(&[1.0, 0.5], &[2])), "tensor([1.0000, 0.5000])");
    assert_eq!(show(&f32s(&[0.0, 1.25], &[2])), "tensor([0.0000, 1.2500])");
    assert_eq!(show(&f32s(&[1234.5678], &[1])), "tensor([1234.5677])");
}

#[test]
fn scientific_notation_for_wide_or_tiny_ranges() {
    assert_eq!(
        show(&f32s(&[1e10, 1.0], &[2])),
        "tensor([1.0000e+10, 1.0000e+00])"
    );
    assert_eq!(
        show(&f32s(&[1e-5, 1.0], &[2])),
        "tensor([1.0000e-05, 1.0000e+00])"
    );
    assert_eq!(
        show(&f32s(&[1e9, 2e9], &[2])),
        "tensor([1.0000e+09, 2.0000e+09])"
    );
    assert_eq!(
        show(&f32s(&[0.5, 2000.0], &[2])),
        "tensor([5.0000e-01, 2.0000e+03])"
    );
    assert_eq!(
        show(&f32s(&[-1e-5, 1.0], &[2])),
        "tensor([-1.0000e-05,  1.0000e+00])"
    );
    // a ratio of exactly 1000 stays fixed
    assert_eq!(show(&f32s(&[1.0, 1000.0], &[2])), "tensor([   1., 1000.])");
}

#[test]
fn nan_and_inf() {
    let t =
        Tensor::from_slice(&[1.0f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY], &[4]).unwrap();
    assert_eq!(show(&t), "tensor([1., nan, inf, -inf])");
    assert_eq!(
        show(&f32s(&[1.5, f32::NAN], &[2])),
        "tensor([1.5000,    nan])"
    );
    assert_eq!(show(&f32s(&[f32::NAN], &[1])), "tensor([nan])");
    assert_eq!(
        show(&f32s(&[f32::INFINITY, 1e10, 1.0], &[3])),
        "tensor([       inf, 1.0000e+10, 1.0000e+00])"
    );
}

#[test]
fn integers_and_bools_right_aligned() {
    let t = tensor![[1, 20], [300, 4]].unwrap();
    assert_eq!(show(&t), "tensor([[  1,  20],\n        [300,   4]])");
    assert_eq!(show(&tensor![-5, 3].unwrap()), "tensor([-5,  3])");
    assert_eq!(
        show(&tensor![true, false].unwrap()),
        "tensor([ True, False])"
    );
    assert_eq!(
        show(&tensor![[true], [true]].unwrap()),
        "tensor([[True],\n        [True]])"
    );
}

#[test]
fn zero_dim_tensors() {
    assert_eq!(show(&Tensor::scalar(3.5)), "tensor(3.5000)");
    assert_eq!(show(&Tensor::scalar(2.0)), "tensor(2.)");
    assert_eq!(show(&Tensor::scalar(5)), "tensor(5)");
    assert_eq!(show(&Tensor::scalar(true)), "tensor(True)");
    let d = Tensor::from_vec(vec![0.25f64], &[]).unwrap();
    assert_eq!(show(&d), "tensor(0.2500, dtype=torch.float64)");
}

#[test]
fn non_default_dtypes_get_a_suffix() {
    let h = Tensor::from_vec(vec![f16::from_f32(1.0), f16::from_f32(2.5)], &[2]).unwrap();
    assert_eq!(show(&h), "tensor([1.0000, 2.5000], dtype=torch.float16)");
    let b = Tensor::from_vec(vec![bf16::from_f32(0.1)], &[1]).unwrap();
    assert_eq!(show(&b), "tensor([0.1001], dtype=torch.bfloat16)");
    let i = Tensor::from_vec(vec![1i32, 2], &[2]).unwrap();
    assert_eq!(show(&i), "tensor([1, 2], dtype=torch.int32)");
    let u = Tensor::from_vec(vec![255u8, 0], &[2]).unwrap();
    assert_eq!(show(&u), "tensor([255,   0], dtype=torch.uint8)");
    let d = Tensor::from_vec(vec![1.0f64, 2.0], &[2]).unwrap();
    assert_eq!(show(&d), "tensor([1., 2.], dtype=torch.float64)");
}

#[test]
fn empty_tensors_show_size_and_dtype() {
    assert_eq!(
        show(&Tensor::zeros(&[0, 3], DType::F32)),
        "tensor([], size=(0, 3))"
    );
    assert_eq!(show(&Tensor::zeros(&[0], DType::F32)), "tensor([])");
    assert_eq!(
        show(&Tensor::zeros(&[0], DType::I64)),
        "tensor([], dtype=torch.int64)"
    );
    assert_eq!(
        show(&Tensor::zeros(&[2, 0], DType::Bool)),
        "tensor([], size=(2, 0), dtype=torch.bool)"
    );
}

#[test]
fn three_dims_separate_blocks_with_a_blank_line() {
    let t = Tensor::arange(0, 8, 1, None)
        .unwrap()
        .reshape(&[2, 2, 2])
        .unwrap();
    assert_eq!(
        show(&t),
        "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]])"
    );
}

#[test]
fn long_rows_wrap_at_eighty_columns() {
    let t = Tensor::arange(0, 30, 1, Some(DType::F32)).unwrap();
    let expected = "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.,\n        14., 15., 16., 17., 18., 19., 20., 21., 22., 23., 24., 25., 26., 27.,\n        28., 29.])";
    assert_eq!(show(&t), expected);
    // a suffix that does not fit goes on its own line
    let d = Tensor::arange(0, 14, 1, Some(DType::F64)).unwrap();
    let expected = "tensor([ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.,  8.,  9., 10., 11., 12., 13.],\n       dtype=torch.float64)";
    assert_eq!(show(&d), expected);
}

#[test]
fn more_than_a_thousand_elements_are_summarised() {
    let t = Tensor::arange(0, 1001, 1, None).unwrap();
    assert_eq!(
        show(&t),
        "tensor([   0,    1,    2,  ...,  998,  999, 1000])"
    );
    // exactly 1000 elements print in full
    assert!(!show(&Tensor::zeros(&[1000], DType::I64)).contains("..."));
    let z = Tensor::zeros(&[40, 40], DType::F32);
    let row = "[0., 0., 0.,  ..., 0., 0., 0.]";
    let expected = format!(
        "tensor([{row},\n        {row},\n        {row},\n        ...,\n        {row},\n        {row},\n        {row}])"
    );
    assert_eq!(show(&z), expected);
}

#[test]
fn summary_format_uses_only_the_shown_values() {
    // the hidden middle value 0.5 would switch the format to four decimals
    let mut v = vec![1.0f32; 2000];
    v[1000] = 0.5;
    let t = f32s(&v, &[2000]);
    assert_eq!(show(&t), "tensor([1., 1., 1.,  ..., 1., 1., 1.])");
}

#[test]
fn non_contiguous_views_print_their_own_order() {
    let t = f32s(&[1.0, 2.0, 3.0, 4.0], &[2, 2]).t().unwrap();
    assert_eq!(show(&t), "tensor([[1., 3.],\n        [2., 4.]])");
    let e = f32s(&[1.5], &[1, 1]).expand(&[2, 3]).unwrap();
    assert_eq!(
        show(&e),
        "tensor([[1.5000, 1.5000, 1.5000],\n        [1.5000, 1.5000, 1.5000]])"
    );
    let s = Tensor::arange(0, 10, 1, None)
        .unwrap()
        .slice(0, Some(1), None, 3)
        .unwrap();
    assert_eq!(show(&s), "tensor([1, 4, 7])");
    assert_eq!(format!("{s:?}"), "tensor([1, 4, 7])");
}
