//! The serialization schema's numbers for dtypes, layouts and memory formats, as tch
//! kinds and as c10's numbers (what an op's argument of those types is).

use tch::Kind;

/// The schema's `ScalarType` as a tch kind (the schema numbers them its own way:
/// FLOAT is 7 there, 6 in c10).
pub(crate) fn kind_of(dtype: i32) -> Option<Kind> {
    Some(match dtype {
        1 => Kind::Uint8,
        2 => Kind::Int8,
        3 => Kind::Int16,
        4 => Kind::Int,
        5 => Kind::Int64,
        6 => Kind::Half,
        7 => Kind::Float,
        8 => Kind::Double,
        9 => Kind::ComplexHalf,
        10 => Kind::ComplexFloat,
        11 => Kind::ComplexDouble,
        12 => Kind::Bool,
        13 => Kind::BFloat16,
        29 => Kind::Float8e4m3fn,
        30 => Kind::Float8e5m2,
        31 => Kind::Float8e4m3fnuz,
        32 => Kind::Float8e5m2fnuz,
        _ => return None,
    })
}

/// The schema's `ScalarType` as c10's number (what an op's `ScalarType` argument is).
pub(super) fn c10_scalar_type(dtype: i32) -> Option<i64> {
    Some(match dtype {
        1..=12 => i64::from(dtype) - 1,
        13 => 15,
        28 => 27,
        29 => 24,
        30 => 23,
        31 => 26,
        32 => 25,
        _ => return None,
    })
}

/// The schema's `Layout` as c10's: strided only (sparse layouts are not run).
pub(super) fn c10_layout(layout: i32) -> Option<i64> {
    (layout == 7).then_some(0)
}

/// The schema's `MemoryFormat` as c10's.
pub(super) fn c10_memory_format(format: i32) -> Option<i64> {
    Some(match format {
        1 => 0, // contiguous
        4 => 1, // preserve
        2 => 2, // channels last
        3 => 3, // channels last 3d
        _ => return None,
    })
}
