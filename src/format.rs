//! Human units, in one place.

/// Bytes in binary units with two decimals: `0 B`, `512 B`, `4.00 KiB`, `16.00 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// A signed change in bytes: `+4.00 MiB`, `-512 B`, `0 B`.
pub fn signed_bytes(n: i64) -> String {
    match n {
        0 => "0 B".to_string(),
        n if n > 0 => format!("+{}", bytes(n as u64)),
        n => format!("-{}", bytes(n.unsigned_abs())),
    }
}

/// FLOPs in decimal units with two decimals: `950 FLOP`, `1.50 kFLOP`, `3.64 GFLOP`.
pub fn flops(n: u64) -> String {
    const UNITS: [&str; 5] = ["kFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"];
    if n < 1000 {
        return format!("{n} FLOP");
    }
    let mut v = n as f64 / 1000.0;
    let mut unit = 0;
    while v >= 1000.0 && unit + 1 < UNITS.len() {
        v /= 1000.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// A shape as `[256, 1024]`.
pub fn shape(dims: &[i64]) -> String {
    let inner: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
    format!("[{}]", inner.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flops_use_decimal_units() {
        assert_eq!(flops(999), "999 FLOP");
        assert_eq!(flops(1_500), "1.50 kFLOP");
        assert_eq!(flops(3_640_000_000), "3.64 GFLOP");
    }

    #[test]
    fn bytes_use_binary_units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1024), "1.00 KiB");
        assert_eq!(bytes(16 * 1024 * 1024), "16.00 MiB");
        assert_eq!(bytes(3 * 1024 * 1024 * 1024 / 2), "1.50 GiB");
    }

    #[test]
    fn signed_bytes_show_direction() {
        assert_eq!(signed_bytes(0), "0 B");
        assert_eq!(signed_bytes(2048), "+2.00 KiB");
        assert_eq!(signed_bytes(-512), "-512 B");
    }

    #[test]
    fn shapes_are_bracketed() {
        assert_eq!(shape(&[256, 1024]), "[256, 1024]");
        assert_eq!(shape(&[]), "[]");
    }
}
