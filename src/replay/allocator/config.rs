//! `PYTORCH_CUDA_ALLOC_CONF`: its parser (PyTorch's `ConfigTokenizer` and
//! `AcceleratorAllocatorConfig` / `CUDAAllocatorConfig`) and the rounding rules that
//! depend on it (`round_size`, `get_allocation_size`, `roundup_power2_divisions`).

use super::*;

const CONF: &str = "PYTORCH_CUDA_ALLOC_CONF";

/// The settings of `PYTORCH_CUDA_ALLOC_CONF` that shape the caching
/// allocator.  Sizes are in bytes; `None` is PyTorch's default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AllocatorConfig {
    /// `max_split_size_mb`: blocks of at least this size are never split.
    /// Default: unlimited.
    pub max_split_size: Option<u64>,
    /// `max_non_split_rounding_mb`: how much larger than a request of at least
    /// `max_split_size` a cached block may be.  Default: `large_segment_size`.
    pub max_non_split_rounding_size: Option<u64>,
    /// `large_segment_size_mb`: segment size for large requests under 10 MiB,
    /// and the page size of expandable large segments.  Default: 20 MiB.
    pub large_segment_size: Option<u64>,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `roundup_power2_divisions`, one entry per power-of-two interval
    /// (index 0: sizes below 2 MiB, index `k`: `[2^k MiB, 2^(k+1) MiB)`,
    /// index 15: 32 GiB and above).  `None`: all zero (plain 512 B rounding).
    pub roundup_power2_divisions: Option<[u64; ROUNDUP_POWER2_INTERVALS]>,
    /// `garbage_collection_threshold`: accepted, not modelled.
    pub garbage_collection_threshold: Option<f64>,
    /// `per_process_memory_fraction`: accepted, not modelled.
    pub per_process_memory_fraction: Option<f64>,
    /// Keys that were accepted but have no effect on this model (host/pinned
    /// allocator settings, locking, CUDA-graph options, the two above).
    pub not_modelled: Vec<String>,
}

/// One `key:value` item of the configuration string.
enum ConfValue {
    Single(String),
    List(Vec<(String, String)>),
}

impl ConfValue {
    fn text(&self) -> String {
        match self {
            ConfValue::Single(s) => s.clone(),
            ConfValue::List(items) => {
                let inner: Vec<String> = items.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                format!("[{}]", inner.join(","))
            }
        }
    }
}

/// Splits like PyTorch's `ConfigTokenizer`: `,` `:` `[` `]` are tokens of
/// their own, whitespace is dropped everywhere.
fn tokenize(conf: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut buffer = String::new();
    for ch in conf.chars() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            if !buffer.is_empty() {
                tokens.push(std::mem::take(&mut buffer));
            }
            tokens.push(ch.to_string());
        } else if !ch.is_whitespace() {
            buffer.push(ch);
        }
    }
    if !buffer.is_empty() {
        tokens.push(buffer);
    }
    tokens
}

fn is_separator(token: &str) -> bool {
    matches!(token, "," | ":" | "[" | "]")
}

/// Groups tokens into `key:value` items.  PyTorch ignores the result of its
/// `checkToken` calls, so it tolerates some malformed strings; this parser is
/// strict about the `key:value,key:value` shape instead.
fn items(tokens: &[String]) -> Result<Vec<(String, ConfValue)>, String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let key = &tokens[i];
        if is_separator(key) {
            return Err(format!("{CONF}: expected a key but found '{key}'"));
        }
        if tokens.get(i + 1).map(String::as_str) != Some(":") {
            return Err(format!(
                "{CONF}: expected ':' and a value after key '{key}'"
            ));
        }
        let value = match tokens.get(i + 2).map(String::as_str) {
            None => return Err(format!("{CONF}: missing value for key '{key}'")),
            Some("[") => {
                let mut j = i + 3;
                let mut list = Vec::new();
                loop {
                    match tokens.get(j).map(String::as_str) {
                        None => return Err(format!("{CONF}: {key}: missing closing ']'")),
                        Some("]") => break,
                        Some(k) if !is_separator(k) => {
                            let colon = tokens.get(j + 1).map(String::as_str);
                            let v = tokens.get(j + 2).map(String::as_str);
                            match (colon, v) {
                                (Some(":"), Some(v)) if !is_separator(v) => {
                                    list.push((k.to_string(), v.to_string()));
                                }
                                _ => {
                                    return Err(format!(
                                        "{CONF}: {key}: expected 'interval:divisions' entries inside [...] near '{k}'"
                                    ))
                                }
                            }
                            j += 3;
                            match tokens.get(j).map(String::as_str) {
                                Some(",") => j += 1,
                                Some("]") => {}
                                None => return Err(format!("{CONF}: {key}: missing closing ']'")),
                                Some(t) => {
                                    return Err(format!(
                                        "{CONF}: {key}: expected ',' or ']' inside [...] but found '{t}'"
                                    ))
                                }
                            }
                        }
                        Some(t) => {
                            return Err(format!("{CONF}: {key}: unexpected '{t}' inside [...]"))
                        }
                    }
                }
                i = j + 1;
                ConfValue::List(list)
            }
            Some(v) if is_separator(v) => {
                return Err(format!(
                    "{CONF}: missing value for key '{key}' (found '{v}')"
                ))
            }
            Some(v) => {
                i += 3;
                ConfValue::Single(v.to_string())
            }
        };
        out.push((key.clone(), value));
        match tokens.get(i).map(String::as_str) {
            None => {}
            Some(",") => i += 1, // a trailing comma is accepted, as in PyTorch
            Some(t) => return Err(format!("{CONF}: expected ',' after {key} but found '{t}'")),
        }
    }
    Ok(out)
}

fn single<'a>(key: &str, value: &'a ConfValue) -> Result<&'a str, String> {
    match value {
        ConfValue::Single(s) => Ok(s),
        ConfValue::List(_) => Err(format!(
            "{CONF}: {key}:{} takes a single value, not a list",
            value.text()
        )),
    }
}

fn parse_u64(key: &str, value: &str) -> Result<u64, String> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{CONF}: {key}:{value} is not a number"));
    }
    value
        .parse::<u64>()
        .map_err(|_| format!("{CONF}: {key}:{value} is too large"))
}

fn parse_f64(key: &str, value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("{CONF}: {key}:{value} is not a number")),
    }
}

fn parse_bool(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(format!(
            "{CONF}: {key}:{value} must be True or False (PyTorch accepts only these spellings)"
        )),
    }
}

/// MiB value to bytes, clamped like PyTorch (`max / kMB`).
fn mib_to_bytes(mb: u64) -> u64 {
    mb.min(u64::MAX / MIB) * MIB
}

fn log2_floor(v: u64) -> usize {
    (63 - v.leading_zeros()) as usize
}

impl AllocatorConfig {
    /// Parses the `PYTORCH_CUDA_ALLOC_CONF` syntax: `key:value` items separated
    /// by commas, whitespace ignored, lists in brackets.  The validation of
    /// PyTorch's parsers is mirrored:
    ///
    /// * `max_split_size_mb:N` and `max_non_split_rounding_mb:N`: integer MiB,
    ///   `N >= large_segment_size_mb` (20 by default);
    /// * `large_segment_size_mb:N`: integer MiB, `N > 10` (read before the
    ///   other keys, as in PyTorch);
    /// * `expandable_segments:True|False` (exactly these spellings);
    /// * `roundup_power2_divisions:N` (N a power of two, applied to every
    ///   interval) or `roundup_power2_divisions:[64:8,256:4,>:1]` (interval
    ///   boundaries in MiB, powers of two; divisions 0 or powers of two; `>`
    ///   sets every interval after the previous entry);
    /// * `garbage_collection_threshold:F` with `0 < F < 1` (not modelled);
    /// * `per_process_memory_fraction:F` with `0 <= F <= 1` (not modelled);
    /// * `backend:native` (`backend:cudaMallocAsync` is an error: not
    ///   modelled);
    /// * accepted without effect: `pinned_use_background_threads`,
    ///   `pinned_use_cuda_host_register`, `pinned_use_hip_host_register`,
    ///   `release_lock_on_cudamalloc`, `release_lock_on_hipmalloc`,
    ///   `graph_capture_record_stream_reuse` (True|False),
    ///   `pinned_num_register_threads` (power of two, at most 128),
    ///   `pinned_reserve_segment_size_mb` (> 0).
    ///
    /// Any other key is an error, as in PyTorch ("Unrecognized key").  The
    /// parser is stricter than PyTorch's about the shape of the string (PyTorch
    /// ignores a missing `:` or `,`, and `std::stoull` reads "12abc" as 12);
    /// such strings are rejected here with a message.
    pub fn parse(conf: &str) -> crate::Result<AllocatorConfig> {
        Self::parse_text(conf).map_err(crate::Error::AllocatorConf)
    }

    fn parse_text(conf: &str) -> Result<AllocatorConfig, String> {
        let tokens = tokenize(conf);
        let items = items(&tokens)?;
        let mut cfg = AllocatorConfig::default();

        // large_segment_size_mb first: the minimum of max_split_size_mb and
        // max_non_split_rounding_mb depends on it.
        for (key, value) in &items {
            if key == "large_segment_size_mb" {
                let v = single(key, value)?;
                let mb = parse_u64(key, v)?;
                let min = K_MIN_LARGE_ALLOC / MIB;
                if mb <= min {
                    return Err(format!("{CONF}: {key}:{v} must be > {min} (MiB)"));
                }
                cfg.large_segment_size = Some(mib_to_bytes(mb));
            }
        }
        let min_split_mb = cfg.large_segment_size() / MIB;

        for (key, value) in &items {
            match key.as_str() {
                "large_segment_size_mb" => {}
                "max_split_size_mb" | "max_non_split_rounding_mb" => {
                    let v = single(key, value)?;
                    let mb = parse_u64(key, v)?;
                    if mb < min_split_mb {
                        return Err(format!(
                            "{CONF}: {key}:{v} is too small, must be >= {min_split_mb} (MiB)"
                        ));
                    }
                    if key == "max_split_size_mb" {
                        cfg.max_split_size = Some(mib_to_bytes(mb));
                    } else {
                        cfg.max_non_split_rounding_size = Some(mib_to_bytes(mb));
                    }
                }
                "expandable_segments" => {
                    cfg.expandable_segments = parse_bool(key, single(key, value)?)?;
                }
                "garbage_collection_threshold" => {
                    let v = single(key, value)?;
                    let f = parse_f64(key, v)?;
                    if f <= 0.0 || f >= 1.0 {
                        return Err(format!(
                            "{CONF}: {key}:{v} is invalid, it must be in (0.0, 1.0)"
                        ));
                    }
                    cfg.garbage_collection_threshold = Some(f);
                    cfg.note(key);
                }
                "per_process_memory_fraction" => {
                    let v = single(key, value)?;
                    let f = parse_f64(key, v)?;
                    if !(0.0..=1.0).contains(&f) {
                        return Err(format!(
                            "{CONF}: {key}:{v} is invalid, it must be in [0.0, 1.0]"
                        ));
                    }
                    cfg.per_process_memory_fraction = Some(f);
                    cfg.note(key);
                }
                "roundup_power2_divisions" => cfg.parse_roundup(key, value)?,
                "backend" => match single(key, value)? {
                    "native" => {}
                    "cudaMallocAsync" | "hipMallocAsync" => {
                        return Err(format!(
                            "{CONF}: {key}:{} is not modelled (this is a model of the native caching allocator)",
                            value.text()
                        ))
                    }
                    v => {
                        return Err(format!(
                            "{CONF}: {key}:{v} is not a known allocator backend (options are native and cudaMallocAsync)"
                        ))
                    }
                },
                "pinned_use_background_threads"
                | "pinned_use_cuda_host_register"
                | "pinned_use_hip_host_register"
                | "release_lock_on_cudamalloc"
                | "release_lock_on_hipmalloc"
                | "graph_capture_record_stream_reuse" => {
                    parse_bool(key, single(key, value)?)?;
                    cfg.note(key);
                }
                "pinned_num_register_threads" => {
                    let v = single(key, value)?;
                    let n = parse_u64(key, v)?;
                    if !n.is_power_of_two() || n > PINNED_MAX_REGISTER_THREADS {
                        return Err(format!(
                            "{CONF}: {key}:{v} must be a power of 2 and at most {PINNED_MAX_REGISTER_THREADS}"
                        ));
                    }
                    cfg.note(key);
                }
                "pinned_reserve_segment_size_mb" => {
                    let v = single(key, value)?;
                    if parse_u64(key, v)? == 0 {
                        return Err(format!("{CONF}: {key}:{v} must be greater than 0"));
                    }
                    cfg.note(key);
                }
                _ => {
                    return Err(format!(
                        "{CONF}: unrecognized key '{key}' (in {key}:{})",
                        value.text()
                    ))
                }
            }
        }
        Ok(cfg)
    }

    /// Reads `PYTORCH_CUDA_ALLOC_CONF`, or else `PYTORCH_ALLOC_CONF` (the
    /// first one that is set is used, as in PyTorch's
    /// `AcceleratorAllocatorConfig::instance`); unset or empty means the
    /// defaults.
    pub fn from_env() -> crate::Result<AllocatorConfig> {
        for var in ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"] {
            match std::env::var(var) {
                Ok(value) => return AllocatorConfig::parse(&value),
                Err(std::env::VarError::NotPresent) => {}
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(crate::Error::AllocatorConf(format!(
                        "{var} is not valid UTF-8"
                    )));
                }
            }
        }
        Ok(AllocatorConfig::default())
    }

    fn note(&mut self, key: &str) {
        if !self.not_modelled.iter().any(|k| k == key) {
            self.not_modelled.push(key.to_string());
        }
    }

    /// `parseRoundUpPower2Divisions`, including its handling of `>`.
    fn parse_roundup(&mut self, key: &str, value: &ConfValue) -> Result<(), String> {
        let mut divs = self.roundup_power2_divisions.unwrap_or_default();
        match value {
            ConfValue::Single(v) => {
                let d = parse_u64(key, v)?;
                if !d.is_power_of_two() {
                    return Err(format!(
                        "{CONF}: {key}:{v}: the divisions must be a power of 2"
                    ));
                }
                divs = [d; ROUNDUP_POWER2_INTERVALS];
            }
            ConfValue::List(list) => {
                let mut first_value = true;
                let mut last_index = 0usize;
                for (interval, v) in list {
                    let d = parse_u64(key, v)?;
                    if d != 0 && !d.is_power_of_two() {
                        return Err(format!(
                            "{CONF}: {key}:{}: divisions {v} must be 0 or a power of 2",
                            value.text()
                        ));
                    }
                    if interval == ">" {
                        for slot in divs.iter_mut().skip(last_index + 1) {
                            *slot = d;
                        }
                    } else {
                        let boundary = parse_u64(key, interval)?;
                        if !boundary.is_power_of_two() {
                            return Err(format!(
                                "{CONF}: {key}:{}: interval {interval} must be a power of 2 (MiB)",
                                value.text()
                            ));
                        }
                        let index = log2_floor(boundary).min(ROUNDUP_POWER2_INTERVALS - 1);
                        if first_value {
                            for slot in divs.iter_mut().take(index) {
                                *slot = d;
                            }
                            first_value = false;
                        }
                        divs[index] = d;
                        last_index = index;
                    }
                }
            }
        }
        self.roundup_power2_divisions = Some(divs);
        Ok(())
    }

    /// `large_segment_size_mb` in bytes (20 MiB by default).
    pub fn large_segment_size(&self) -> u64 {
        self.large_segment_size.unwrap_or(K_LARGE_BUFFER)
    }

    /// `max_split_size` in bytes (`u64::MAX` when unlimited).
    pub fn max_split_size_bytes(&self) -> u64 {
        self.max_split_size.unwrap_or(u64::MAX)
    }

    /// `max_non_split_rounding_size` in bytes (`large_segment_size` by default).
    pub fn max_non_split_rounding_bytes(&self) -> u64 {
        self.max_non_split_rounding_size
            .unwrap_or_else(|| self.large_segment_size())
    }

    /// The divisions that apply to a (rounded-to-512) size
    /// (`AcceleratorAllocatorConfig::roundup_power2_divisions(size)`).
    pub fn divisions_for(&self, size: u64) -> u64 {
        match &self.roundup_power2_divisions {
            None => 0,
            Some(divs) => {
                let log_size = log2_floor(size.max(1));
                let start = log2_floor(MIB);
                let index = log_size
                    .saturating_sub(start)
                    .min(ROUNDUP_POWER2_INTERVALS - 1);
                divs[index]
            }
        }
    }

    /// PyTorch's `round_size`: the size of the block a request of `bytes`
    /// asks for.  `bytes` must be below 2^60.
    pub fn round_size(&self, bytes: u64) -> u64 {
        if bytes < K_MIN_BLOCK_SIZE {
            return K_MIN_BLOCK_SIZE;
        }
        let divisions = self.divisions_for(bytes);
        if divisions > 1 && bytes > K_MIN_BLOCK_SIZE.saturating_mul(divisions) {
            roundup_power2_next_division(bytes, divisions)
        } else {
            bytes.div_ceil(K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
        }
    }

    /// PyTorch's `get_allocation_size`: the size of a new (non-expandable)
    /// segment for a rounded request.
    pub fn allocation_size(&self, size: u64) -> u64 {
        if size <= K_SMALL_SIZE {
            K_SMALL_BUFFER
        } else if size < K_MIN_LARGE_ALLOC {
            self.large_segment_size()
        } else {
            size.div_ceil(K_ROUND_LARGE) * K_ROUND_LARGE
        }
    }
}

/// `roundup_power2_next_division`: rounds `size` up to the next of
/// `divisions` equal steps between the powers of two around it.
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let power2_floor = 1u64 << log2_floor(size);
    let power2_division = power2_floor >> log2_floor(divisions);
    if power2_division == 0 {
        return power2_floor << 1;
    }
    let floor = size & !(power2_division - 1);
    if floor == size {
        size
    } else {
        floor + power2_division
    }
}
