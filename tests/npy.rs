//! `.npy` reading and writing: round trips of every dtype, files written byte by byte the way
//! NumPy writes them (Fortran order, big-endian, unsigned types), and malformed files.

mod common;

use common::temp_dir;
use half::{bf16, f16};
use smelt::runtime::npy::{npy_to_bytes, read_npy, read_npy_bytes, write_npy};
use smelt::{DType, Element, Error, Tensor};

/// A version-1.0 `.npy` file as NumPy writes it: header padded with spaces to a multiple of 64
/// bytes and ended by a newline.
fn npy_file(descr: &str, fortran: bool, shape: &str, data: &[u8]) -> Vec<u8> {
    let order = if fortran { "True" } else { "False" };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// The dims of a header's `'shape': (...)` entry.
fn header_shape(h: &str) -> Vec<usize> {
    let rest = &h[h.find("'shape': (").expect("shape entry") + 10..];
    let inner = &rest[..rest.find(')').expect("closing parenthesis")];
    inner
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().unwrap())
        .collect()
}

fn header_text(bytes: &[u8]) -> String {
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    String::from_utf8(bytes[10..10 + len].to_vec()).unwrap()
}

/// Values of every kind a dtype can hold, cycled to `n` elements.
fn values<T: Element>(n: usize) -> Vec<T> {
    let pool: Vec<f64> = if T::DTYPE.is_float() {
        vec![
            0.0,
            -0.0,
            1.5,
            -2.25,
            1e-3,
            65504.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            3.0,
        ]
    } else {
        vec![0.0, 1.0, -1.0, 7.0, -100.0, 127.0, -128.0, 42.0]
    };
    (0..n)
        .map(|i| {
            let v = pool[i % pool.len()];
            if T::DTYPE == DType::I64 && i % 5 == 4 {
                T::from_i64(i64::MIN + i as i64)
            } else if T::DTYPE.is_float() || T::DTYPE == DType::Bool {
                T::from_f64(v)
            } else {
                T::from_i64(v as i64)
            }
        })
        .collect()
}

fn round_trip<T: Element>(shape: &[usize]) {
    let n: usize = shape.iter().product();
    let data = values::<T>(n);
    let t = Tensor::from_vec(data.clone(), shape).unwrap();
    let bytes = npy_to_bytes(&t).unwrap();
    let back = read_npy_bytes(&bytes, "mem.npy").unwrap();
    assert_eq!(back.dtype(), T::DTYPE, "dtype of {shape:?}");
    assert_eq!(back.shape(), shape);
    if n == 0 {
        return;
    }
    let got = back.to_vec::<T>().unwrap();
    // Compare bit patterns through f64 so that -0.0 and 0.0 are told apart.
    let bits = |v: &[T]| v.iter().map(|x| x.to_f64().to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&data), "values of {} {shape:?}", T::DTYPE);
}

fn round_trip_all<T: Element>() {
    for shape in [
        &[][..],
        &[0],
        &[1],
        &[5],
        &[2, 0, 3],
        &[2, 3, 4],
        &[1, 1, 1, 7],
    ] {
        round_trip::<T>(shape);
    }
}

#[test]
fn every_dtype_round_trips() {
    round_trip_all::<bool>();
    round_trip_all::<u8>();
    round_trip_all::<i8>();
    round_trip_all::<i16>();
    round_trip_all::<i32>();
    round_trip_all::<i64>();
    round_trip_all::<f16>();
    round_trip_all::<f32>();
    round_trip_all::<f64>();
}

#[test]
fn nan_survives_a_round_trip() {
    let t = Tensor::from_vec(vec![f32::NAN, 1.0], &[2]).unwrap();
    let back = read_npy_bytes(&npy_to_bytes(&t).unwrap(), "m").unwrap();
    let v = back.to_vec::<f32>().unwrap();
    assert!(v[0].is_nan());
    assert_eq!(v[1], 1.0);
}

#[test]
fn written_header_is_what_numpy_expects() {
    let t = Tensor::from_vec(vec![1.0f32; 6], &[2, 3]).unwrap();
    let bytes = npy_to_bytes(&t).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let h = header_text(&bytes);
    assert!(h.contains("'descr': '<f4'"), "{h}");
    assert!(h.contains("'fortran_order': False"), "{h}");
    assert_eq!(header_shape(&h), vec![2, 3], "{h}");
    assert!(h.ends_with('\n'));
    assert_eq!((10 + h.len()) % 16, 0, "data must start aligned");
    assert_eq!(bytes.len(), 10 + h.len() + 24);
    assert_eq!(
        &bytes[10 + h.len()..10 + h.len() + 4],
        &1.0f32.to_le_bytes()
    );

    let s = npy_to_bytes(&Tensor::from_vec(vec![5i64], &[]).unwrap()).unwrap();
    assert!(
        header_text(&s).contains("'shape': ()"),
        "{}",
        header_text(&s)
    );
    assert_eq!(header_shape(&header_text(&s)), Vec::<usize>::new());
    let one = npy_to_bytes(&Tensor::from_vec(vec![5u8], &[1]).unwrap()).unwrap();
    // A one-element Python tuple needs its comma.
    assert!(
        header_text(&one).contains("'shape': (1,"),
        "{}",
        header_text(&one)
    );
    assert!(header_text(&one).contains("'|u1'"), "{}", header_text(&one));
}

#[test]
fn a_hand_written_file_reads() {
    let data: Vec<u8> = [1i32, -2, 3, 4, 5, -6]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let t = read_npy_bytes(&npy_file("<i4", false, "(2, 3)", &data), "a.npy").unwrap();
    assert_eq!(t.dtype(), DType::I32);
    assert_eq!(t.shape(), &[2, 3]);
    assert_eq!(t.to_vec::<i32>().unwrap(), vec![1, -2, 3, 4, 5, -6]);
}

#[test]
fn non_contiguous_tensors_are_written_in_logical_order() {
    let t = Tensor::from_vec((0..6).map(|i| i as f64).collect(), &[2, 3]).unwrap();
    let tt = t.transpose(0, 1).unwrap();
    let back = read_npy_bytes(&npy_to_bytes(&tt).unwrap(), "m").unwrap();
    assert_eq!(back.shape(), &[3, 2]);
    assert_eq!(
        back.to_vec::<f64>().unwrap(),
        vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    let stepped = t.slice(1, None, None, 2).unwrap();
    let back = read_npy_bytes(&npy_to_bytes(&stepped).unwrap(), "m").unwrap();
    assert_eq!(back.to_vec::<f64>().unwrap(), vec![0.0, 2.0, 3.0, 5.0]);
}

#[test]
fn bf16_is_written_as_f32() {
    let vals = [1.0f32, -0.5, 3.140625, 1e30];
    let b: Vec<bf16> = vals.iter().map(|&v| bf16::from_f32(v)).collect();
    let t = Tensor::from_vec(b.clone(), &[2, 2]).unwrap();
    let bytes = npy_to_bytes(&t).unwrap();
    assert!(header_text(&bytes).contains("'<f4'"));
    let back = read_npy_bytes(&bytes, "m").unwrap();
    assert_eq!(back.dtype(), DType::F32);
    let want: Vec<f32> = b.iter().map(|v| v.to_f32()).collect();
    assert_eq!(back.to_vec::<f32>().unwrap(), want);
}

#[test]
fn fortran_order_is_transposed_on_read() {
    // numpy.asfortranarray(numpy.arange(6).reshape(2, 3)) stores the columns one after another.
    let data: Vec<u8> = [0.0f32, 3.0, 1.0, 4.0, 2.0, 5.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let t = read_npy_bytes(&npy_file("<f4", true, "(2, 3)", &data), "f.npy").unwrap();
    assert_eq!(t.shape(), &[2, 3]);
    assert!(t.is_contiguous());
    assert_eq!(
        t.to_vec::<f32>().unwrap(),
        vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    );

    // 3-d: element (i, j, k) sits at i + 2 j + 6 k.
    let (a, b, c) = (2usize, 3usize, 4usize);
    let mut stored = vec![0i16; a * b * c];
    for i in 0..a {
        for j in 0..b {
            for k in 0..c {
                stored[i + a * j + a * b * k] = (100 * i + 10 * j + k) as i16;
            }
        }
    }
    let data: Vec<u8> = stored.iter().flat_map(|v| v.to_le_bytes()).collect();
    let t = read_npy_bytes(&npy_file("<i2", true, "(2, 3, 4)", &data), "f.npy").unwrap();
    let want: Vec<i16> = (0..a * b * c)
        .map(|n| (100 * (n / (b * c)) + 10 * (n / c % b) + n % c) as i16)
        .collect();
    assert_eq!(t.to_vec::<i16>().unwrap(), want);

    // Fortran order of 0-d and 1-d arrays is the same as C order.
    let t = read_npy_bytes(&npy_file("<f8", true, "()", &2.5f64.to_le_bytes()), "f.npy").unwrap();
    assert_eq!(t.shape(), &[] as &[usize]);
    assert_eq!(t.to_vec::<f64>().unwrap(), vec![2.5]);
}

#[test]
fn big_endian_data_reads() {
    let vals = [1.5f64, -2.0, 1e300, f64::MIN_POSITIVE];
    let data: Vec<u8> = vals.iter().flat_map(|v| v.to_be_bytes()).collect();
    let t = read_npy_bytes(&npy_file(">f8", false, "(4,)", &data), "be.npy").unwrap();
    assert_eq!(t.dtype(), DType::F64);
    assert_eq!(t.to_vec::<f64>().unwrap(), vals.to_vec());

    let ints = [1i32, -1, 0x01020304, i32::MIN];
    let data: Vec<u8> = ints.iter().flat_map(|v| v.to_be_bytes()).collect();
    let t = read_npy_bytes(&npy_file(">i4", true, "(2, 2)", &data), "be.npy").unwrap();
    // Fortran order: stored column by column.
    assert_eq!(
        t.to_vec::<i32>().unwrap(),
        vec![1, 0x01020304, -1, i32::MIN]
    );

    let h = [f16::from_f32(0.5), f16::from_f32(-3.0)];
    let data: Vec<u8> = h.iter().flat_map(|v| v.to_bits().to_be_bytes()).collect();
    let t = read_npy_bytes(&npy_file(">f2", false, "(2,)", &data), "be.npy").unwrap();
    assert_eq!(t.to_vec::<f16>().unwrap(), h.to_vec());
}

#[test]
fn bool_bytes_other_than_one_read_as_true() {
    let t = read_npy_bytes(&npy_file("|b1", false, "(3,)", &[0, 1, 2]), "b.npy").unwrap();
    assert_eq!(t.to_vec::<bool>().unwrap(), vec![false, true, true]);
}

#[test]
fn unsigned_types_are_widened() {
    let data: Vec<u8> = [0u16, 65535, 7]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let t = read_npy_bytes(&npy_file("<u2", false, "(3,)", &data), "u.npy").unwrap();
    assert_eq!(t.dtype(), DType::I32);
    assert_eq!(t.to_vec::<i32>().unwrap(), vec![0, 65535, 7]);

    let data: Vec<u8> = [u32::MAX, 1].iter().flat_map(|v| v.to_be_bytes()).collect();
    let t = read_npy_bytes(&npy_file(">u4", false, "(2,)", &data), "u.npy").unwrap();
    assert_eq!(t.dtype(), DType::I64);
    assert_eq!(t.to_vec::<i64>().unwrap(), vec![u32::MAX as i64, 1]);

    let data: Vec<u8> = [3u64, i64::MAX as u64]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let t = read_npy_bytes(&npy_file("<u8", false, "(2,)", &data), "u.npy").unwrap();
    assert_eq!(t.dtype(), DType::I64);
    assert_eq!(t.to_vec::<i64>().unwrap(), vec![3, i64::MAX]);

    let data: Vec<u8> = [3u64, u64::MAX]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let e = read_npy_bytes(&npy_file("<u8", false, "(2,)", &data), "u.npy").unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("u.npy: "), "{msg}");
    assert!(
        msg.contains("18446744073709551615") && msg.contains("i64"),
        "{msg}"
    );
}

fn expect_value_error(bytes: &[u8], needles: &[&str]) {
    match read_npy_bytes(bytes, "bad.npy") {
        Err(Error::Value(msg)) => {
            assert!(msg.starts_with("bad.npy: "), "{msg}");
            for n in needles {
                assert!(msg.contains(n), "{msg:?} should mention {n:?}");
            }
        }
        Err(e) => panic!("expected a value error, got {e:?}"),
        Ok(t) => panic!("expected an error, got a tensor of shape {:?}", t.shape()),
    }
}

#[test]
fn unsupported_dtypes_are_named() {
    expect_value_error(
        &npy_file("<c8", false, "(1,)", &[0; 8]),
        &["complex64", "'<c8'"],
    );
    expect_value_error(&npy_file("<c16", false, "(1,)", &[0; 16]), &["complex128"]);
    expect_value_error(
        &npy_file("<U3", false, "(1,)", &[0; 12]),
        &["unicode string"],
    );
    expect_value_error(&npy_file("|S4", false, "(1,)", &[0; 4]), &["bytes string"]);
    expect_value_error(&npy_file("|O", false, "(1,)", &[0; 8]), &["object"]);
    expect_value_error(
        &npy_file("<M8[ns]", false, "(1,)", &[0; 8]),
        &["datetime64"],
    );
    expect_value_error(&npy_file("<f16", false, "(1,)", &[0; 16]), &["float128"]);
    let structured = {
        let mut header =
            "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (1,), }"
                .to_string();
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(&[0; 8]);
        out
    };
    expect_value_error(&structured, &["structured"]);
}

#[test]
fn malformed_files_are_errors_not_panics() {
    let good = npy_file("<f4", false, "(2, 3)", &[0; 24]);
    // Truncated anywhere: inside the magic, the header, or the data.
    for cut in [0, 3, 8, 9, 10, 40, good.len() - 24, good.len() - 1] {
        assert!(
            read_npy_bytes(&good[..cut], "bad.npy").is_err(),
            "cut at {cut}"
        );
    }
    expect_value_error(&good[..good.len() - 1], &["truncated", "24 bytes"]);
    expect_value_error(&good[..20], &["truncated"]);
    expect_value_error(b"PK\x03\x04 this is a zip file", &["not a .npy file"]);
    expect_value_error(b"", &["not a .npy file"]);
    let mut extra = good.clone();
    extra.push(0);
    expect_value_error(&extra, &["unexpected bytes"]);
    let mut version = good.clone();
    version[6] = 9;
    expect_value_error(&version, &["version 9"]);

    // Headers a parser could choke on.
    expect_value_error(&npy_file("<f4", false, "(-1,)", &[]), &["shape"]);
    expect_value_error(&npy_file("<f4", false, "(2, 3", &[0; 24]), &[]);
    expect_value_error(&npy_file("<f4", false, "'abc'", &[]), &["shape"]);
    expect_value_error(&npy_file("<q9", false, "(1,)", &[0; 8]), &[]);
    expect_value_error(
        &npy_file("<f4", false, "(4294967296, 4294967296, 0)", &[]),
        &["too large"],
    );
    expect_value_error(
        &npy_file("<f4", false, "(4294967296, 4294967296)", &[]),
        &["too large"],
    );
    expect_value_error(
        &npy_file("<f4", false, "(1099511627776,)", &[0; 4]),
        &["truncated"],
    );
    let deep = format!("{}1{}", "(".repeat(5000), ")".repeat(5000));
    expect_value_error(&npy_file("<f4", false, &deep, &[]), &["nested"]);
    // a short header nested a dozen deep: the header parser's time grows 3-4x a level, so
    // this one took 22 s before the depth limit came down to 6 (found by fuzzing)
    let braces = format!("(0, 3), 'x': {}'a'{}", "{".repeat(12), "}".repeat(12));
    expect_value_error(&npy_file("<f4", false, &braces, &[]), &["nested"]);
    // the deepest a header may be still reads
    let five = format!("(2,), 'x': {}'a'{}", "{".repeat(4), "}".repeat(4));
    assert!(read_npy_bytes(&npy_file("<f4", false, &five, &[0; 8]), "ok.npy").is_ok());
    let mut no_dict = b"\x93NUMPY\x01\x00".to_vec();
    no_dict.extend_from_slice(&6u16.to_le_bytes());
    no_dict.extend_from_slice(b"hello\n");
    expect_value_error(&no_dict, &[]);
    let mut huge = b"\x93NUMPY\x02\x00".to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    expect_value_error(&huge, &["too long"]);
}

#[test]
fn files_on_disk() {
    let dir = temp_dir("files");
    let path = dir.join("t.npy");
    let t = Tensor::from_vec(vec![1i64, 2, 3], &[3, 1]).unwrap();
    write_npy(&path, &t).unwrap();
    let back = read_npy(&path).unwrap();
    assert_eq!(back.shape(), &[3, 1]);
    assert_eq!(back.to_vec::<i64>().unwrap(), vec![1, 2, 3]);

    let missing = dir.join("missing.npy");
    match read_npy(&missing) {
        Err(Error::Io(msg)) => assert!(msg.contains("missing.npy"), "{msg}"),
        other => panic!("expected an io error, got {other:?}"),
    }
    std::fs::write(&path, b"garbage").unwrap();
    match read_npy(&path) {
        Err(Error::Value(msg)) => assert!(msg.contains("t.npy"), "{msg}"),
        other => panic!("expected a value error, got {other:?}"),
    }
    let e = write_npy(dir.join("no/such/dir/x.npy"), &t).unwrap_err();
    assert!(
        matches!(e, Error::Io(ref m) if m.contains("x.npy")),
        "{e:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
