//! A model of PyTorch's CUDA caching allocator, for one device and one stream.
//!
//! The dry run on libtorch's meta device records the sequence of allocations
//! and frees of a workload (sizes, order, lifetimes).  [`CachingAllocator`]
//! replays that sequence through the same decisions the native CUDA caching
//! allocator makes and reports what `torch.cuda.memory_stats()` would show:
//! allocated bytes (block sizes handed out), reserved bytes (memory obtained
//! from the driver), requested bytes (the original request sizes) and their
//! peaks.
//!
//! # Source
//!
//! Modelled on PyTorch's `c10/cuda/CUDACachingAllocator.cpp`
//! (`DeviceCachingAllocator`), `c10/core/AllocatorConfig.{h,cpp}`
//! (`AcceleratorAllocatorConfig`, `ConfigTokenizer`) and
//! `c10/cuda/CUDAAllocatorConfig.cpp`, version 2.11 (read in the main-branch
//! source of early 2026, from which 2.11 was branched in February 2026).
//! The rules modelled here have been stable through the 2.x releases; the
//! one recent addition is the `large_segment_size_mb` option (January 2026),
//! which makes the former 20 MiB constants (`kLargeBuffer`, and the default of
//! `max_non_split_rounding_mb`) configurable; releases without it reject the
//! key and behave as with the default of 20.
//!
//! # What is modelled
//!
//! Constants (`c10/core/AllocatorConfig.h`):
//!
//! | name             | value   | meaning                                                   |
//! |------------------|---------|-----------------------------------------------------------|
//! | `kMinBlockSize`  | 512 B   | every request is rounded up to a multiple of this         |
//! | `kSmallSize`     | 1 MiB   | rounded requests up to this size use the small pool       |
//! | `kSmallBuffer`   | 2 MiB   | segment size for the small pool                           |
//! | `kLargeBuffer`   | 20 MiB  | segment size for large requests under `kMinLargeAlloc` (the `large_segment_size_mb` option, default 20) |
//! | `kMinLargeAlloc` | 10 MiB  | large requests from here on get their own segment         |
//! | `kRoundLarge`    | 2 MiB   | those segments are rounded up to a multiple of this       |
//!
//! * `round_size`: `max(512, request)` rounded up to a multiple of 512 B, or,
//!   when `roundup_power2_divisions` gives `d > 1` divisions for the size's
//!   power-of-two interval and the size exceeds `512 * d`, rounded up to the
//!   next of `d` equal steps between the surrounding powers of two
//!   (`roundup_power2_next_division`).
//! * pools: rounded size `<= kSmallSize` goes to the small pool, others to
//!   the large pool.  A new segment (`get_allocation_size`) is
//!   `kSmallBuffer` for the small pool, `large_segment_size` (20 MiB) for
//!   sizes below `kMinLargeAlloc`, else the size rounded up to `kRoundLarge`.
//! * `get_free_block`: best fit, i.e. the first free block of the pool in
//!   `(stream, size, address)` order with `size >= request`; then
//!   `max_split_size` vetoes: a request `< max_split_size` never takes a block
//!   `>= max_split_size`, and a request `>= max_split_size` takes a block only
//!   if the block is `< request + max_non_split_rounding_size` (20 MiB by
//!   default).  A veto means a new segment, not a further search.
//! * `should_split`: small pool (or expandable segments): remainder
//!   `>= kMinBlockSize`; large pool: `request < max_split_size` and remainder
//!   `> kSmallSize`.  Unsplit blocks are charged whole to `allocated`.
//! * `free_block` / `try_merge_blocks`: a freed block merges with free
//!   neighbours of the same segment.
//! * `empty_cache` (`release_cached_blocks`): every segment whose single block
//!   is free is released; with expandable segments every fully free page is
//!   unmapped and an expandable segment with nothing mapped is released.
//! * stats: `allocated_bytes` counts block sizes, `reserved_bytes` segment
//!   (or mapped page) sizes, `requested_bytes` the original requests; each
//!   with a peak, updated on every increase; `reset_peaks` sets peak = current.
//! * `expandable_segments:True` (`try_allocate_expandable_block`,
//!   `find_expandable_block`, `map_block`, `unmap_block`): each pool has one
//!   segment with a huge virtual range that is backed by physical pages on
//!   demand; pages are `kSmallBuffer` (2 MiB) in the small pool and
//!   `large_segment_size` (20 MiB) in the large pool.  On a cache miss the
//!   lowest-address free-or-unmapped run that can hold the *rounded request*
//!   (no 20 MiB / 2 MiB segment rounding) is mapped page by page and merged
//!   with the free block before it; reserved grows by the mapped pages.  Every
//!   block of an expandable segment is split when the remainder is at least
//!   512 B.  Best fit treats a free block that borders unmapped space as
//!   being as large as it could grow, so other fitting blocks are preferred
//!   (the `expandable_size` walk in `get_free_block`).  The `max_split_size`
//!   vetoes apply here too; a vetoed request then grows the segment (or takes
//!   the free block that borders unmapped space) instead of getting a new
//!   segment.  `segments` stays 0, as PyTorch's `segment` stat does.
//!
//! # What is not modelled
//!
//! * More than one stream or device, `record_stream` and its events, CUDA
//!   graph private pools and `MemPool`s.
//! * Failure of `cudaMalloc` and everything on the out-of-memory path
//!   (`release_available_cached_blocks`, the retry after
//!   `release_cached_blocks`); segments are assumed always to be obtained.
//!   `per_process_memory_fraction` and `garbage_collection_threshold`
//!   (whose collection only runs when a memory fraction is set) are parsed
//!   and kept but have no effect here.
//! * `backend:cudaMallocAsync` (a different allocator): parsing it is an
//!   error.
//! * Addresses are simulated: each new segment gets a fresh address above
//!   all earlier ones.  Ties between free blocks of equal size go to the lower
//!   address as in PyTorch, but real `cudaMalloc` addresses can come in
//!   another order (for instance after `empty_cache`), so among equal-size
//!   blocks a different one may be chosen than on the GPU.  Sizes and the
//!   totals do not depend on that except through later merges.
//! * An expandable segment's virtual range is 1 TiB here; PyTorch reserves
//!   1.125 x the GPU's memory.  The difference only matters past the GPU's
//!   capacity, which is not modelled.
//! * Requests of 1 EiB or more are refused by PyTorch with an
//!   out-of-memory error; here they are counted (`refused_requests`) and
//!   allocate nothing.

use std::collections::{BTreeSet, HashMap, HashSet};

const MIB: u64 = 1024 * 1024;
/// All sizes are rounded to at least this (`kMinBlockSize`).
pub const K_MIN_BLOCK_SIZE: u64 = 512;
/// Largest "small" request (`kSmallSize`).
pub const K_SMALL_SIZE: u64 = MIB;
/// Small-pool segment size and expandable small-pool page size (`kSmallBuffer`).
pub const K_SMALL_BUFFER: u64 = 2 * MIB;
/// Default large segment size (`kLargeBuffer`, `large_segment_size_mb:20`).
pub const K_LARGE_BUFFER: u64 = 20 * MIB;
/// Requests from this size on get a segment of their own (`kMinLargeAlloc`).
pub const K_MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Rounding of those segments (`kRoundLarge`).
pub const K_ROUND_LARGE: u64 = 2 * MIB;

/// Number of power-of-two intervals of `roundup_power2_divisions`
/// (1 MiB .. 64 GiB; index `floor(log2(size)) - 20`, clamped to 0..=15).
pub const ROUNDUP_POWER2_INTERVALS: usize = 16;
/// Requests this large are refused by PyTorch (`one_exa_bytes`).
const ONE_EXA_BYTES: u64 = 1 << 60;
/// Virtual size given to an expandable segment (see module docs).
const EXPANDABLE_VIRTUAL_SIZE: u64 = 1 << 40;
/// Upper bound of `pinned_num_register_threads` (`pinned_max_register_threads`).
const PINNED_MAX_REGISTER_THREADS: u64 = 128;

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
    pub fn parse(conf: &str) -> Result<AllocatorConfig, String> {
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
    pub fn from_env() -> Result<AllocatorConfig, String> {
        for var in ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"] {
            match std::env::var(var) {
                Ok(value) => return AllocatorConfig::parse(&value),
                Err(std::env::VarError::NotPresent) => {}
                Err(std::env::VarError::NotUnicode(_)) => {
                    return Err(format!("{var} is not valid UTF-8"));
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

/// What the allocator reports, in bytes (as `torch.cuda.memory_stats()`'s
/// `*.all.current` / `*.all.peak` entries).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// `allocated_bytes.all.current`: sizes of the blocks handed out.
    pub allocated: u64,
    /// `reserved_bytes.all.current`: segments (or mapped pages) held.
    pub reserved: u64,
    /// `requested_bytes.all.current`: the original request sizes.
    pub requested: u64,
    /// `allocated_bytes.all.peak`.
    pub peak_allocated: u64,
    /// `reserved_bytes.all.peak`.
    pub peak_reserved: u64,
    /// `requested_bytes.all.peak`.
    pub peak_requested: u64,
    /// `segment.all.current`: segments obtained with cudaMalloc.  Expandable
    /// segments are not counted here, as in PyTorch.
    pub segments: u64,
    /// `allocation.all.current`: live blocks.
    pub allocations: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PoolKind {
    Small,
    Large,
}

#[derive(Clone, Debug)]
struct Block {
    size: u64,
    requested: u64,
    allocated: bool,
    /// Backed by memory.  Always true outside expandable segments.
    mapped: bool,
    prev: Option<u64>,
    next: Option<u64>,
    pool: PoolKind,
    /// Base address of the expandable segment the block belongs to.
    expandable: Option<u64>,
}

#[derive(Default)]
struct Pool {
    /// Free, mapped blocks ordered like PyTorch's `BlockComparatorSize`
    /// (one stream: size, then address).
    free: BTreeSet<(u64, u64)>,
    /// Unmapped ranges of expandable segments, by address.
    unmapped: BTreeSet<u64>,
}

#[derive(Clone, Copy, Debug)]
struct ExpandableSegment {
    page: u64,
}

/// Replays allocations and frees through a model of PyTorch's CUDA caching
/// allocator (one device, one stream).  See the module documentation.
pub struct CachingAllocator {
    config: AllocatorConfig,
    blocks: HashMap<u64, Block>,
    small: Pool,
    large: Pool,
    expandable_segments: HashMap<u64, ExpandableSegment>,
    live: HashMap<u64, u64>,
    zero_sized: HashSet<u64>,
    next_address: u64,
    stats: AllocatorStats,
    unknown_frees: u64,
    refused_requests: u64,
}

impl CachingAllocator {
    /// An empty allocator (nothing reserved) with the given settings.
    pub fn new(config: AllocatorConfig) -> Self {
        CachingAllocator {
            config,
            blocks: HashMap::new(),
            small: Pool::default(),
            large: Pool::default(),
            expandable_segments: HashMap::new(),
            live: HashMap::new(),
            zero_sized: HashSet::new(),
            next_address: 1 << 32,
            stats: AllocatorStats::default(),
            unknown_frees: 0,
            refused_requests: 0,
        }
    }

    /// The settings this allocator replays with.
    pub fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    /// Allocates `bytes` for the caller's block `id` (ids are unique among
    /// live blocks; reusing a live id frees its block first); returns the
    /// block size charged to allocated.  `bytes == 0`: no block (PyTorch
    /// returns a null pointer), returns 0, and a later `free(id)` is accepted
    /// silently.
    pub fn malloc(&mut self, id: u64, bytes: u64) -> u64 {
        if self.live.contains_key(&id) || self.zero_sized.contains(&id) {
            self.free(id);
        }
        if bytes == 0 {
            self.zero_sized.insert(id);
            return 0;
        }
        if bytes >= ONE_EXA_BYTES {
            self.refused_requests += 1;
            return 0;
        }
        let size = self.config.round_size(bytes);
        let kind = if size <= K_SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        let addr = match self.get_free_block(kind, size) {
            Some(addr) => addr,
            None => self.alloc_block(kind, size),
        };
        let split = self.should_split(addr, size);
        let charged = self.alloc_found_block(addr, size, bytes, split);
        self.live.insert(id, addr);
        charged
    }

    /// Frees block `id`; an unknown id is ignored and counted
    /// ([`CachingAllocator::unknown_frees`]).
    pub fn free(&mut self, id: u64) {
        let addr = match self.live.remove(&id) {
            Some(addr) => addr,
            None => {
                if !self.zero_sized.remove(&id) {
                    self.unknown_frees += 1;
                }
                return;
            }
        };
        let (size, requested) = {
            let b = self.blocks.get_mut(&addr).expect("live block");
            b.allocated = false;
            (b.size, b.requested)
        };
        self.stats.allocated -= size;
        self.stats.requested -= requested;
        self.stats.allocations -= 1;
        self.free_block(addr);
    }

    /// Current values and peaks.
    pub fn stats(&self) -> AllocatorStats {
        self.stats
    }

    /// Frees of ids that were not live.
    pub fn unknown_frees(&self) -> u64 {
        self.unknown_frees
    }

    /// Requests of 1 EiB or more (PyTorch raises an out-of-memory error).
    pub fn refused_requests(&self) -> u64 {
        self.refused_requests
    }

    /// `torch.cuda.reset_peak_memory_stats()`: every peak becomes the current
    /// value.
    pub fn reset_peaks(&mut self) {
        self.stats.peak_allocated = self.stats.allocated;
        self.stats.peak_reserved = self.stats.reserved;
        self.stats.peak_requested = self.stats.requested;
    }

    /// `torch.cuda.empty_cache()`: releases every segment that holds no
    /// allocated block; with expandable segments, unmaps every fully free page
    /// and releases segments left with nothing mapped.
    pub fn empty_cache(&mut self) {
        self.release_blocks(PoolKind::Large);
        self.release_blocks(PoolKind::Small);
    }

    // ----- internals, named after DeviceCachingAllocator's methods -----

    fn pool(&self, kind: PoolKind) -> &Pool {
        match kind {
            PoolKind::Small => &self.small,
            PoolKind::Large => &self.large,
        }
    }

    fn pool_mut(&mut self, kind: PoolKind) -> &mut Pool {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    fn block(&self, addr: u64) -> &Block {
        &self.blocks[&addr]
    }

    fn block_mut(&mut self, addr: u64) -> &mut Block {
        self.blocks.get_mut(&addr).expect("block exists")
    }

    fn add_reserved(&mut self, bytes: u64) {
        self.stats.reserved += bytes;
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
    }

    fn bump_address(&mut self, size: u64) -> u64 {
        let addr = self.next_address;
        self.next_address = (addr + size).div_ceil(K_SMALL_BUFFER) * K_SMALL_BUFFER;
        addr
    }

    /// `expandable_size`: a free block that borders unmapped space counts as
    /// large as it could grow.
    fn expandable_size(&self, addr: u64) -> u64 {
        let b = self.block(addr);
        match b.next {
            Some(n) if !self.block(n).mapped => b.size.saturating_add(self.block(n).size),
            _ => b.size,
        }
    }

    fn get_free_block(&mut self, kind: PoolKind, size: u64) -> Option<u64> {
        let expandable_active = self.config.expandable_segments;
        let (block_size, addr) = {
            let pool = self.pool(kind);
            let mut it = pool.free.range((size, 0)..);
            let mut cur = *it.next()?;
            if expandable_active {
                while self.block(cur.1).expandable.is_some() {
                    match it.next() {
                        Some(&next)
                            if self.expandable_size(next.1) < self.expandable_size(cur.1) =>
                        {
                            cur = next;
                        }
                        _ => break,
                    }
                }
            }
            cur
        };
        let max_split = self.config.max_split_size_bytes();
        // Do not return an oversized block for a large request.
        if size < max_split && block_size >= max_split {
            return None;
        }
        // Allow oversized block size to be rounded up but within a limit.
        if size >= max_split
            && block_size >= size.saturating_add(self.config.max_non_split_rounding_bytes())
        {
            return None;
        }
        self.pool_mut(kind).free.remove(&(block_size, addr));
        Some(addr)
    }

    fn alloc_block(&mut self, kind: PoolKind, size: u64) -> u64 {
        if self.config.expandable_segments {
            return self.try_allocate_expandable_block(kind, size);
        }
        let alloc_size = self.config.allocation_size(size);
        let addr = self.bump_address(alloc_size);
        self.blocks.insert(
            addr,
            Block {
                size: alloc_size,
                requested: 0,
                allocated: false,
                mapped: true,
                prev: None,
                next: None,
                pool: kind,
                expandable: None,
            },
        );
        self.stats.segments += 1;
        self.add_reserved(alloc_size);
        addr
    }

    fn should_split(&self, addr: u64, size: u64) -> bool {
        let b = self.block(addr);
        let remaining = b.size - size;
        if b.pool == PoolKind::Small || self.config.expandable_segments {
            remaining >= K_MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size_bytes() && remaining > K_SMALL_SIZE
        }
    }

    fn alloc_found_block(&mut self, addr: u64, size: u64, orig_size: u64, split: bool) -> u64 {
        if split {
            let (rest_size, next, kind, expandable) = {
                let b = self.block(addr);
                (b.size - size, b.next, b.pool, b.expandable)
            };
            let rest_addr = addr + size;
            if let Some(n) = next {
                self.block_mut(n).prev = Some(rest_addr);
            }
            self.blocks.insert(
                rest_addr,
                Block {
                    size: rest_size,
                    requested: 0,
                    allocated: false,
                    mapped: true,
                    prev: Some(addr),
                    next,
                    pool: kind,
                    expandable,
                },
            );
            self.pool_mut(kind).free.insert((rest_size, rest_addr));
            let b = self.block_mut(addr);
            b.size = size;
            b.next = Some(rest_addr);
        }
        let block_size = {
            let b = self.block_mut(addr);
            b.allocated = true;
            b.requested = orig_size;
            b.size
        };
        let s = &mut self.stats;
        s.allocations += 1;
        s.allocated += block_size;
        s.peak_allocated = s.peak_allocated.max(s.allocated);
        s.requested += orig_size;
        s.peak_requested = s.peak_requested.max(s.requested);
        block_size
    }

    fn free_block(&mut self, addr: u64) {
        let (prev, next, kind) = {
            let b = self.block(addr);
            (b.prev, b.next, b.pool)
        };
        let mut dst = addr;
        if let Some(p) = prev {
            dst = self.try_merge_blocks(dst, p);
        }
        if let Some(n) = next {
            dst = self.try_merge_blocks(dst, n);
        }
        let size = self.block(dst).size;
        self.pool_mut(kind).free.insert((size, dst));
    }

    /// Merges `src` into its neighbour `dst` when `src` is free and in the
    /// same mapped state; neither is in a pool set on entry except `src`.
    /// Returns the (possibly new) address of `dst`.
    fn try_merge_blocks(&mut self, dst: u64, src: u64) -> u64 {
        let (src_size, src_prev, src_next, src_mapped, kind) = {
            let s = self.block(src);
            if s.allocated || s.mapped != self.block(dst).mapped {
                return dst;
            }
            (s.size, s.prev, s.next, s.mapped, s.pool)
        };
        let pool = self.pool_mut(kind);
        if src_mapped {
            pool.free.remove(&(src_size, src));
        } else {
            pool.unmapped.remove(&src);
        }
        self.blocks.remove(&src);
        let mut d = self.blocks.remove(&dst).expect("block exists");
        d.size += src_size;
        let new_addr = if d.prev == Some(src) {
            // [src dst]
            d.prev = src_prev;
            if let Some(p) = src_prev {
                self.block_mut(p).next = Some(src);
            }
            if let Some(n) = d.next {
                self.block_mut(n).prev = Some(src);
            }
            src
        } else {
            // [dst src]
            d.next = src_next;
            if let Some(n) = src_next {
                self.block_mut(n).prev = Some(dst);
            }
            dst
        };
        self.blocks.insert(new_addr, d);
        new_addr
    }

    // ----- expandable segments -----

    fn allocatable(&self, addr: Option<u64>) -> bool {
        addr.is_some_and(|a| !self.block(a).allocated)
    }

    fn has_available_address_space(&self, start: u64, size: u64) -> bool {
        let mut bytes = 0u64;
        let mut cur = Some(start);
        while bytes < size && self.allocatable(cur) {
            let b = self.block(cur.expect("allocatable block"));
            bytes = bytes.saturating_add(b.size);
            cur = b.next;
        }
        bytes >= size
    }

    /// `find_expandable_block`: the lowest-address run of free and unmapped
    /// blocks that can hold `size`, or a new segment.
    fn find_expandable_block(&mut self, kind: PoolKind, size: u64) -> u64 {
        let unmapped: Vec<u64> = self.pool(kind).unmapped.iter().copied().collect();
        for u in unmapped {
            let mut c = u;
            let prev = self.block(u).prev;
            if self.allocatable(prev) {
                c = prev.expect("allocatable block");
            }
            if self.has_available_address_space(c, size) {
                return c;
            }
        }
        let page = match kind {
            PoolKind::Small => K_SMALL_BUFFER,
            PoolKind::Large => self.config.large_segment_size(),
        };
        let virtual_size = EXPANDABLE_VIRTUAL_SIZE.div_ceil(page) * page;
        let base = self.bump_address(virtual_size);
        self.expandable_segments
            .insert(base, ExpandableSegment { page });
        self.blocks.insert(
            base,
            Block {
                size: virtual_size,
                requested: 0,
                allocated: false,
                mapped: false,
                prev: None,
                next: None,
                pool: kind,
                expandable: Some(base),
            },
        );
        self.pool_mut(kind).unmapped.insert(base);
        base
    }

    /// `map_block`: backs the first `size` bytes of the unmapped block
    /// `to_map` with whole pages, merges it with free neighbours and puts it
    /// in the free set.  Returns its address after merging.
    fn map_block(&mut self, to_map: u64, size: u64) -> u64 {
        let (base, block_size, next, kind) = {
            let b = self.block(to_map);
            debug_assert!(!b.mapped && size <= b.size);
            (
                b.expandable.expect("expandable block"),
                b.size,
                b.next,
                b.pool,
            )
        };
        let page = self.expandable_segments[&base].page;
        // Unmapped blocks start on a page boundary.
        let mapped = size.div_ceil(page) * page;
        debug_assert!(mapped <= block_size);
        self.pool_mut(kind).unmapped.remove(&to_map);
        self.block_mut(to_map).mapped = true;
        if mapped < block_size {
            let rest = to_map + mapped;
            if let Some(n) = next {
                self.block_mut(n).prev = Some(rest);
            }
            self.blocks.insert(
                rest,
                Block {
                    size: block_size - mapped,
                    requested: 0,
                    allocated: false,
                    mapped: false,
                    prev: Some(to_map),
                    next,
                    pool: kind,
                    expandable: Some(base),
                },
            );
            self.pool_mut(kind).unmapped.insert(rest);
            let b = self.block_mut(to_map);
            b.size = mapped;
            b.next = Some(rest);
        }
        let mut dst = to_map;
        if let Some(p) = self.block(dst).prev {
            dst = self.try_merge_blocks(dst, p);
        }
        if let Some(n) = self.block(dst).next {
            dst = self.try_merge_blocks(dst, n);
        }
        let merged = self.block(dst).size;
        self.pool_mut(kind).free.insert((merged, dst));
        self.add_reserved(mapped);
        dst
    }

    /// `try_allocate_expandable_block`: maps enough pages for `size` at the
    /// lowest possible address and returns the free block that now holds at
    /// least `size` bytes (taken out of the free set).
    fn try_allocate_expandable_block(&mut self, kind: PoolKind, size: u64) -> u64 {
        let mut candidate = self.find_expandable_block(kind, size);
        if !self.block(candidate).mapped {
            let to_map = self.block(candidate).size.min(size);
            candidate = self.map_block(candidate, to_map);
        }
        while self.block(candidate).size < size {
            let remaining = size - self.block(candidate).size;
            let next = self
                .block(candidate)
                .next
                .expect("free block followed by unmapped space");
            let to_map = remaining.min(self.block(next).size);
            candidate = self.map_block(next, to_map);
        }
        let csize = self.block(candidate).size;
        self.pool_mut(kind).free.remove(&(csize, candidate));
        candidate
    }

    /// `unmap_block`: unmaps the whole pages inside the free block `addr`.
    /// Returns the address of the unmapped block, if any page was unmapped.
    fn unmap_block(&mut self, addr: u64) -> Option<u64> {
        let (size, prev, next, kind, base) = {
            let b = self.block(addr);
            (
                b.size,
                b.prev,
                b.next,
                b.pool,
                b.expandable.expect("expandable block"),
            )
        };
        let page = self.expandable_segments[&base].page;
        let first_page = (addr - base).div_ceil(page);
        let end_page = (addr + size - base) / page;
        if first_page >= end_page {
            return None;
        }
        let unmapped_addr = base + first_page * page;
        let unmapped_size = (end_page - first_page) * page;
        self.pool_mut(kind).free.remove(&(size, addr));
        self.blocks.remove(&addr);

        let before = unmapped_addr - addr;
        let after = size - before - unmapped_size;
        let after_addr = unmapped_addr + unmapped_size;
        let mut u = Block {
            size: unmapped_size,
            requested: 0,
            allocated: false,
            mapped: false,
            prev,
            next,
            pool: kind,
            expandable: Some(base),
        };
        if before > 0 {
            self.blocks.insert(
                addr,
                Block {
                    size: before,
                    requested: 0,
                    allocated: false,
                    mapped: true,
                    prev,
                    next: Some(unmapped_addr),
                    pool: kind,
                    expandable: Some(base),
                },
            );
            self.pool_mut(kind).free.insert((before, addr));
            u.prev = Some(addr);
        } else if let Some(p) = prev {
            self.block_mut(p).next = Some(unmapped_addr);
        }
        if after > 0 {
            self.blocks.insert(
                after_addr,
                Block {
                    size: after,
                    requested: 0,
                    allocated: false,
                    mapped: true,
                    prev: Some(unmapped_addr),
                    next,
                    pool: kind,
                    expandable: Some(base),
                },
            );
            self.pool_mut(kind).free.insert((after, after_addr));
            u.next = Some(after_addr);
            if let Some(n) = next {
                self.block_mut(n).prev = Some(after_addr);
            }
        } else if let Some(n) = next {
            self.block_mut(n).prev = Some(unmapped_addr);
        }
        self.blocks.insert(unmapped_addr, u);

        let mut dst = unmapped_addr;
        if let Some(p) = self.block(dst).prev {
            dst = self.try_merge_blocks(dst, p);
        }
        if let Some(n) = self.block(dst).next {
            dst = self.try_merge_blocks(dst, n);
        }
        self.pool_mut(kind).unmapped.insert(dst);
        self.stats.reserved -= unmapped_size;
        Some(dst)
    }

    /// `release_blocks`: frees every unsplit free segment of a pool and unmaps
    /// the free pages of its expandable segments.
    fn release_blocks(&mut self, kind: PoolKind) {
        let free: Vec<(u64, u64)> = self.pool(kind).free.iter().copied().collect();
        let mut to_unmap = Vec::new();
        for (size, addr) in free {
            let b = self.block(addr);
            if b.expandable.is_some() {
                to_unmap.push(addr);
            } else if b.prev.is_none() && b.next.is_none() {
                self.pool_mut(kind).free.remove(&(size, addr));
                self.blocks.remove(&addr);
                self.stats.reserved -= size;
                self.stats.segments -= 1;
            }
        }
        for addr in to_unmap {
            if let Some(u) = self.unmap_block(addr) {
                let b = self.block(u);
                if b.prev.is_none() && b.next.is_none() {
                    let base = b.expandable.expect("expandable block");
                    self.pool_mut(kind).unmapped.remove(&u);
                    self.blocks.remove(&u);
                    self.expandable_segments.remove(&base);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;

    fn alloc() -> CachingAllocator {
        CachingAllocator::new(AllocatorConfig::default())
    }

    fn alloc_with(conf: &str) -> CachingAllocator {
        CachingAllocator::new(AllocatorConfig::parse(conf).expect("valid config"))
    }

    /// Walks every segment and checks the bookkeeping against the stats.
    fn check_invariants(a: &CachingAllocator) {
        let mut allocated = 0;
        let mut requested = 0;
        let mut mapped = 0;
        let mut live = 0;
        let mut segments = 0;
        let mut free_small = BTreeSet::new();
        let mut free_large = BTreeSet::new();
        let mut unmapped_small = BTreeSet::new();
        let mut unmapped_large = BTreeSet::new();
        for (&addr, b) in &a.blocks {
            if let Some(p) = b.prev {
                let pb = &a.blocks[&p];
                assert_eq!(pb.next, Some(addr));
                assert_eq!(p + pb.size, addr, "blocks are contiguous");
                assert!(
                    b.allocated || pb.allocated || pb.mapped != b.mapped,
                    "adjacent free blocks in the same state are merged"
                );
            } else if b.expandable.is_none() {
                segments += 1;
            }
            if let Some(n) = b.next {
                assert_eq!(a.blocks[&n].prev, Some(addr));
            }
            if b.allocated {
                allocated += b.size;
                requested += b.requested;
                live += 1;
            }
            if b.mapped {
                mapped += b.size;
                if !b.allocated {
                    match b.pool {
                        PoolKind::Small => free_small.insert((b.size, addr)),
                        PoolKind::Large => free_large.insert((b.size, addr)),
                    };
                }
            } else {
                match b.pool {
                    PoolKind::Small => unmapped_small.insert(addr),
                    PoolKind::Large => unmapped_large.insert(addr),
                };
            }
        }
        let s = a.stats();
        assert_eq!(s.allocated, allocated);
        assert_eq!(s.requested, requested);
        assert_eq!(s.reserved, mapped);
        assert_eq!(s.allocations, live);
        assert_eq!(s.segments, segments);
        assert_eq!(a.small.free, free_small);
        assert_eq!(a.large.free, free_large);
        assert_eq!(a.small.unmapped, unmapped_small);
        assert_eq!(a.large.unmapped, unmapped_large);
        assert!(s.peak_allocated >= s.allocated && s.peak_reserved >= s.reserved);
        assert!(s.allocated <= s.reserved && s.requested <= s.allocated);
    }

    #[test]
    fn small_request_rounds_to_512_in_a_2mib_segment() {
        let mut a = alloc();
        // 100 B -> round_size 512 B; small pool; new segment kSmallBuffer = 2 MiB,
        // split because the remainder 2 MiB - 512 B >= 512 B.
        assert_eq!(a.malloc(1, 100), 512);
        let s = a.stats();
        assert_eq!((s.allocated, s.requested, s.reserved), (512, 100, 2 * MIB));
        assert_eq!((s.segments, s.allocations), (1, 1));
        // 513 B -> 1024 B; 1 MiB exactly is still small.
        assert_eq!(a.malloc(2, 513), 1024);
        assert_eq!(a.malloc(3, MIB), MIB);
        assert_eq!(a.stats().reserved, 2 * MIB);
        check_invariants(&a);
    }

    #[test]
    fn small_segments_are_shared_until_full() {
        let mut a = alloc();
        // 700 KiB = 716800 B (a multiple of 512).  Segment 2097152 B:
        // 1st: remainder 1380352; 2nd: remainder 663552 < 716800, so the 3rd
        // needs a second 2 MiB segment.  (Three 600 KiB requests = 1800 KiB
        // would all fit into one 2 MiB segment.)
        for id in 0..2 {
            assert_eq!(a.malloc(id, 700 * KIB), 700 * KIB);
        }
        assert_eq!(a.stats().reserved, 2 * MIB);
        assert_eq!(a.stats().segments, 1);
        a.malloc(2, 700 * KIB);
        assert_eq!(a.stats().reserved, 4 * MIB);
        assert_eq!(a.stats().segments, 2);
        assert_eq!(a.stats().allocated, 3 * 700 * KIB);

        let mut b = alloc();
        for id in 0..3 {
            b.malloc(id, 600 * KIB);
        }
        assert_eq!(b.stats().reserved, 2 * MIB);
        check_invariants(&a);
        check_invariants(&b);
    }

    #[test]
    fn mid_size_requests_share_a_20mib_segment() {
        let mut a = alloc();
        // 3 MiB: large pool, < kMinLargeAlloc -> 20 MiB segment; remainder
        // 17 MiB > 1 MiB -> split.
        assert_eq!(a.malloc(1, 3 * MIB), 3 * MIB);
        assert_eq!(a.stats().reserved, 20 * MIB);
        // The second 3 MiB splits the 17 MiB free block (remainder 14 MiB).
        assert_eq!(a.malloc(2, 3 * MIB), 3 * MIB);
        let s = a.stats();
        assert_eq!(
            (s.allocated, s.reserved, s.segments),
            (6 * MIB, 20 * MIB, 1)
        );
        assert!(a.large.free.contains(&(14 * MIB, a.live[&2] + 3 * MIB)));
        check_invariants(&a);
    }

    #[test]
    fn unsplit_remainder_is_charged_to_allocated() {
        let mut a = alloc();
        // 19.5 MiB = 20447232 B: >= 10 MiB -> segment rounded to 2 MiB = 20 MiB;
        // remainder 0.5 MiB is not > 1 MiB -> not split, 20 MiB allocated.
        let req = 19 * MIB + MIB / 2;
        assert_eq!(a.malloc(1, req), 20 * MIB);
        let s = a.stats();
        assert_eq!(
            (s.allocated, s.requested, s.reserved),
            (20 * MIB, req, 20 * MIB)
        );
        check_invariants(&a);
    }

    #[test]
    fn large_requests_get_segments_rounded_to_2mib() {
        let mut a = alloc();
        // 12 MiB -> 12 MiB segment (already a multiple of 2 MiB).
        assert_eq!(a.malloc(1, 12 * MIB), 12 * MIB);
        assert_eq!(a.stats().reserved, 12 * MIB);
        // 13 MiB -> 14 MiB segment; remainder 1 MiB is not > 1 MiB -> 14 MiB
        // allocated.
        assert_eq!(a.malloc(2, 13 * MIB), 14 * MIB);
        let s = a.stats();
        assert_eq!(
            (s.allocated, s.reserved, s.segments),
            (26 * MIB, 26 * MIB, 2)
        );
        // 1 MiB + 1 B rounds to 1 MiB + 512 B: large pool, 20 MiB segment.
        assert_eq!(a.malloc(3, MIB + 1), MIB + 512);
        assert_eq!(a.stats().reserved, 46 * MIB);
        check_invariants(&a);
    }

    #[test]
    fn best_fit_takes_the_smallest_fitting_block() {
        let mut a = alloc();
        a.malloc(1, 16 * MIB); // 16 MiB segment
        a.malloc(2, 12 * MIB); // 12 MiB segment
        a.free(1);
        a.free(2);
        assert_eq!(a.stats().reserved, 28 * MIB);
        // 11 MiB: fitting free blocks 12 MiB and 16 MiB -> 12 MiB; remainder
        // 1 MiB not > 1 MiB -> unsplit, 12 MiB allocated, no new segment.
        assert_eq!(a.malloc(3, 11 * MIB), 12 * MIB);
        // 15 MiB takes the 16 MiB block (remainder 1 MiB, unsplit).
        assert_eq!(a.malloc(4, 15 * MIB), 16 * MIB);
        let s = a.stats();
        assert_eq!(
            (s.allocated, s.reserved, s.segments),
            (28 * MIB, 28 * MIB, 2)
        );
        check_invariants(&a);
    }

    #[test]
    fn equal_sizes_are_taken_by_address() {
        let mut a = alloc();
        a.malloc(1, 12 * MIB);
        a.malloc(2, 12 * MIB);
        let (first, second) = (a.live[&1], a.live[&2]);
        assert!(first < second);
        a.free(2);
        a.free(1);
        a.malloc(3, 12 * MIB);
        assert_eq!(a.live[&3], first);
        check_invariants(&a);
    }

    #[test]
    fn freed_neighbours_merge() {
        let mut a = alloc();
        // Five 4 MiB requests fill one 20 MiB segment: remainders 16, 12, 8, 4
        // MiB are split (> 1 MiB); the fifth takes the last 4 MiB exactly.
        for id in 1..=5 {
            assert_eq!(a.malloc(id, 4 * MIB), 4 * MIB);
        }
        assert_eq!((a.stats().reserved, a.stats().segments), (20 * MIB, 1));
        assert!(a.large.free.is_empty());
        // Freeing the 2nd and 3rd leaves one merged 8 MiB block.
        a.free(2);
        a.free(3);
        assert_eq!(a.large.free.len(), 1);
        assert_eq!(a.large.free.iter().next().unwrap().0, 8 * MIB);
        // 7 MiB fits in it (remainder 1 MiB unsplit -> 8 MiB allocated), no new
        // segment.
        assert_eq!(a.malloc(6, 7 * MIB), 8 * MIB);
        let s = a.stats();
        assert_eq!(
            (s.allocated, s.reserved, s.segments),
            (20 * MIB, 20 * MIB, 1)
        );
        // Everything freed merges back into the one 20 MiB block.
        for id in [1, 4, 5, 6] {
            a.free(id);
        }
        assert_eq!(a.large.free.len(), 1);
        assert_eq!(a.large.free.iter().next().unwrap().0, 20 * MIB);
        check_invariants(&a);
    }

    #[test]
    fn max_split_size_rules() {
        // max_split_size_mb:40 (>= 20).
        let mut a = alloc_with("max_split_size_mb:40");
        // 50 MiB -> 50 MiB segment.
        a.malloc(1, 50 * MIB);
        a.free(1);
        // 45 MiB >= 40 MiB: the 50 MiB block is < 45 + 20 MiB -> taken, and not
        // split (request not < max_split_size): 50 MiB allocated.
        assert_eq!(a.malloc(2, 45 * MIB), 50 * MIB);
        a.free(2);
        // 25 MiB < 40 MiB: the best fit (50 MiB) is >= max_split_size -> vetoed;
        // new segment of 26 MiB (25 MiB rounded to 2 MiB).
        assert_eq!(a.malloc(3, 25 * MIB), 26 * MIB);
        assert_eq!(a.stats().reserved, 76 * MIB);
        // A request under max_split_size still splits a 20 MiB segment.
        assert_eq!(a.malloc(4, 3 * MIB), 3 * MIB);
        assert_eq!(a.stats().reserved, 96 * MIB);
        check_invariants(&a);

        let mut b = alloc_with("max_split_size_mb:40");
        b.malloc(1, 80 * MIB);
        b.free(1);
        // 42 MiB >= 40 MiB but 80 MiB >= 42 + 20 MiB -> vetoed, new 42 MiB
        // segment.
        assert_eq!(b.malloc(2, 42 * MIB), 42 * MIB);
        assert_eq!(b.stats().reserved, 122 * MIB);
        // With max_non_split_rounding_mb:40 the 80 MiB block (< 42 + 40) is
        // taken whole.
        let mut c = alloc_with("max_split_size_mb:40,max_non_split_rounding_mb:40");
        c.malloc(1, 80 * MIB);
        c.free(1);
        assert_eq!(c.malloc(2, 42 * MIB), 80 * MIB);
        assert_eq!(c.stats().reserved, 80 * MIB);
        check_invariants(&b);
        check_invariants(&c);
    }

    #[test]
    fn without_max_split_size_large_blocks_are_split() {
        let mut a = alloc();
        a.malloc(1, 80 * MIB);
        a.free(1);
        // Unlimited max_split_size: 42 MiB splits the 80 MiB block.
        assert_eq!(a.malloc(2, 42 * MIB), 42 * MIB);
        assert_eq!(a.malloc(3, 30 * MIB), 30 * MIB);
        assert_eq!(a.stats().reserved, 80 * MIB);
        check_invariants(&a);
    }

    #[test]
    fn expandable_segments_map_pages() {
        let mut a = alloc_with("expandable_segments:True");
        // 3 MiB: maps one 20 MiB page; remainder 17 MiB >= 512 -> split.
        assert_eq!(a.malloc(1, 3 * MIB), 3 * MIB);
        assert_eq!(a.stats().reserved, 20 * MIB);
        // 30 MiB: the free 17 MiB tail is too small; it grows by mapping
        // 13 MiB -> one more 20 MiB page (37 MiB), split: 7 MiB stay free.
        assert_eq!(a.malloc(2, 30 * MIB), 30 * MIB);
        let s = a.stats();
        assert_eq!(
            (s.allocated, s.reserved, s.segments),
            (33 * MIB, 40 * MIB, 0)
        );
        assert_eq!(
            a.live[&2],
            a.live[&1] + 3 * MIB,
            "the segment grew in place"
        );
        // Without expandable segments: 20 MiB + 30 MiB segments.
        let mut b = alloc();
        b.malloc(1, 3 * MIB);
        b.malloc(2, 30 * MIB);
        assert_eq!(b.stats().reserved, 50 * MIB);
        // 13 MiB in a fresh expandable allocator: one 20 MiB page, split
        // (13 MiB allocated, not the 14 MiB unsplit segment).
        let mut c = alloc_with("expandable_segments:True");
        assert_eq!(c.malloc(1, 13 * MIB), 13 * MIB);
        assert_eq!(c.stats().reserved, 20 * MIB);
        // 100 B in the small pool: one 2 MiB page.
        assert_eq!(c.malloc(2, 100), 512);
        assert_eq!(c.stats().reserved, 22 * MIB);
        // 100 MiB: 7 MiB free at the tail, 93 MiB more -> 5 pages (100 MiB).
        assert_eq!(c.malloc(3, 100 * MIB), 100 * MIB);
        assert_eq!(c.stats().reserved, 122 * MIB);
        check_invariants(&a);
        check_invariants(&c);
    }

    #[test]
    fn expandable_best_fit_prefers_blocks_that_cannot_grow() {
        let mut a = alloc_with("expandable_segments:True");
        a.malloc(1, 5 * MIB); // [0,5) of a 20 MiB page
        a.malloc(2, 11 * MIB); // [5,16), free tail [16,20) borders unmapped space
        let start = a.live[&1];
        a.free(1); // free [0,5), next to the allocated block: no merge
        assert_eq!(a.large.free.len(), 2);
        // 4 MiB: the first fit is the 4 MiB tail, but it counts as 4 MiB +
        // the unmapped rest; the 5 MiB block is smaller by that measure.
        assert_eq!(a.malloc(3, 4 * MIB), 4 * MIB);
        assert_eq!(a.live[&3], start);
        let s = a.stats();
        assert_eq!((s.allocated, s.reserved), (15 * MIB, 20 * MIB));
        // 2 MiB: the free blocks are [4,5) (1 MiB, too small) and the tail
        // [16,20); the tail is used and no page is mapped.
        assert_eq!(a.malloc(4, 2 * MIB), 2 * MIB);
        assert_eq!(a.live[&4], start + 16 * MIB);
        assert_eq!(a.stats().reserved, 20 * MIB);
        check_invariants(&a);
    }

    #[test]
    fn expandable_empty_cache_unmaps_free_pages() {
        let mut a = alloc_with("expandable_segments:True");
        a.malloc(1, 3 * MIB); // [0,3)
        a.malloc(2, 30 * MIB); // [3,33), pages [0,40) mapped
        a.free(2); // free [3,40)
        assert_eq!(a.stats().reserved, 40 * MIB);
        // Page [20,40) is wholly free and unmapped; [3,20) stays mapped.
        a.empty_cache();
        assert_eq!(a.stats().reserved, 20 * MIB);
        check_invariants(&a);
        // Growing again maps the page back.
        assert_eq!(a.malloc(3, 30 * MIB), 30 * MIB);
        assert_eq!(a.stats().reserved, 40 * MIB);
        assert_eq!(a.live[&3], a.live[&1] + 3 * MIB);
        check_invariants(&a);
        // All freed: empty_cache releases everything and the segment.
        a.free(1);
        a.free(3);
        a.malloc(4, 100);
        a.free(4);
        a.empty_cache();
        assert_eq!(a.stats().reserved, 0);
        assert!(a.blocks.is_empty() && a.expandable_segments.is_empty());
        assert_eq!(a.stats().peak_reserved, 42 * MIB);
        check_invariants(&a);
    }

    #[test]
    fn expandable_hole_is_refilled_first() {
        let mut a = alloc_with("expandable_segments:True");
        // Three pages worth: A [0,20), B [20,40), C [40,60).
        a.malloc(1, 20 * MIB);
        a.malloc(2, 20 * MIB);
        a.malloc(3, 20 * MIB);
        let start = a.live[&1];
        a.free(2);
        a.empty_cache(); // unmaps [20,40): a hole between A and C
        assert_eq!(a.stats().reserved, 40 * MIB);
        // 10 MiB: no free mapped block; the hole is the lowest unmapped range.
        assert_eq!(a.malloc(4, 10 * MIB), 10 * MIB);
        assert_eq!(a.live[&4], start + 20 * MIB);
        assert_eq!(a.stats().reserved, 60 * MIB);
        check_invariants(&a);
    }

    #[test]
    fn empty_cache_releases_only_fully_free_segments() {
        let mut a = alloc();
        a.malloc(1, 100); // small segment, stays in use
        a.malloc(2, 3 * MIB); // 20 MiB segment X
        a.malloc(3, 3 * MIB); // also in X
        a.malloc(4, 16 * MIB); // X has 14 MiB free: new 16 MiB segment, freed below
        a.malloc(5, 50 * MIB); // 50 MiB segment, stays in use
        a.free(2); // X is still partly used
        a.free(4);
        assert_eq!(a.stats().reserved, (2 + 20 + 16 + 50) * MIB);
        a.empty_cache();
        // Only the 16 MiB segment had no allocated block.
        let s = a.stats();
        assert_eq!((s.reserved, s.segments), ((2 + 20 + 50) * MIB, 3));
        a.free(3);
        a.free(1);
        a.empty_cache();
        assert_eq!((a.stats().reserved, a.stats().segments), (50 * MIB, 1));
        assert_eq!(a.stats().peak_reserved, 88 * MIB);
        check_invariants(&a);
    }

    #[test]
    fn peaks_track_and_reset() {
        let mut a = alloc();
        a.malloc(1, 3 * MIB);
        a.malloc(2, 3 * MIB);
        a.free(1);
        a.free(2);
        a.malloc(3, 100);
        let s = a.stats();
        assert_eq!((s.allocated, s.peak_allocated), (512, 6 * MIB));
        assert_eq!((s.requested, s.peak_requested), (100, 6 * MIB));
        assert_eq!((s.reserved, s.peak_reserved), (22 * MIB, 22 * MIB));
        a.empty_cache(); // releases the 20 MiB segment
        assert_eq!(a.stats().reserved, 2 * MIB);
        a.reset_peaks();
        let s = a.stats();
        assert_eq!(
            (s.peak_allocated, s.peak_requested, s.peak_reserved),
            (512, 100, 2 * MIB)
        );
    }

    #[test]
    fn zero_bytes_and_unknown_frees() {
        let mut a = alloc();
        assert_eq!(a.malloc(1, 0), 0);
        assert_eq!(a.stats(), AllocatorStats::default());
        a.free(1); // null pointer free: silent
        assert_eq!(a.unknown_frees(), 0);
        a.free(1);
        a.free(99);
        assert_eq!(a.unknown_frees(), 2);
        assert_eq!(a.malloc(2, 1 << 60), 0);
        assert_eq!(a.refused_requests(), 1);
        // A live id reused frees its old block first.
        a.malloc(3, 3 * MIB);
        a.malloc(3, 100);
        assert_eq!(a.stats().allocated, 512);
        assert_eq!(a.stats().allocations, 1);
        check_invariants(&a);
    }

    #[test]
    fn roundup_power2_divisions_rounding() {
        let cfg = AllocatorConfig::parse("roundup_power2_divisions:4").unwrap();
        // 1200 B: 4 divisions but 1200 <= 512 * 4 -> plain rounding to 1536.
        assert_eq!(cfg.round_size(1200), 1536);
        // 3000 B > 2048: between 2048 and 4096 in steps of 512 -> 3072.
        assert_eq!(cfg.round_size(3000), 3072);
        // 5 MiB + 1: between 4 and 8 MiB in steps of 1 MiB -> 6 MiB.
        assert_eq!(cfg.round_size(5 * MIB + 1), 6 * MIB);
        // Powers of two stay.
        assert_eq!(cfg.round_size(4 * MIB), 4 * MIB);

        // [256:8,>:2]: intervals 0..=8 get 8 divisions, 9..=15 get 2.
        let cfg = AllocatorConfig::parse("roundup_power2_divisions:[256:8,>:2]").unwrap();
        let divs = cfg.roundup_power2_divisions.unwrap();
        assert_eq!(divs[..9], [8; 9]);
        assert_eq!(divs[9..], [2; 7]);
        // 300 MiB (interval 8): steps of 32 MiB above 256 MiB -> 320 MiB.
        assert_eq!(cfg.round_size(300 * MIB), 320 * MIB);
        // 600 MiB (interval 9): steps of 256 MiB above 512 MiB -> 768 MiB.
        assert_eq!(cfg.round_size(600 * MIB), 768 * MIB);

        // A leading '>' leaves interval 0 alone (PyTorch fills from
        // last_index + 1).
        let cfg = AllocatorConfig::parse("roundup_power2_divisions:[>:4]").unwrap();
        let divs = cfg.roundup_power2_divisions.unwrap();
        assert_eq!(divs[0], 0);
        assert_eq!(divs[1..], [4; 15]);

        // In the allocator: 5 MiB + 1 with 4 divisions -> a 6 MiB block.
        let mut a = alloc_with("roundup_power2_divisions:4");
        assert_eq!(a.malloc(1, 5 * MIB + 1), 6 * MIB);
        assert_eq!(a.stats().requested, 5 * MIB + 1);
    }

    #[test]
    fn large_segment_size_option() {
        // large_segment_size_mb:32: a 3 MiB request gets a 32 MiB segment.
        let mut a = alloc_with("large_segment_size_mb:32");
        a.malloc(1, 3 * MIB);
        assert_eq!(a.stats().reserved, 32 * MIB);
        // 20 MiB splits the 29 MiB remainder (9 MiB left); 12 MiB
        // (>= kMinLargeAlloc) then gets its own 12 MiB segment.
        a.malloc(2, 20 * MIB);
        assert_eq!(a.stats().reserved, 32 * MIB); // fits in the 29 MiB remainder
        a.malloc(3, 12 * MIB);
        assert_eq!(a.stats().reserved, 44 * MIB);
        // max_split_size_mb must now be >= 32.
        assert!(AllocatorConfig::parse("large_segment_size_mb:32,max_split_size_mb:30").is_err());
        assert!(AllocatorConfig::parse("max_split_size_mb:30,large_segment_size_mb:32").is_err());
        assert!(AllocatorConfig::parse("large_segment_size_mb:32,max_split_size_mb:32").is_ok());
        check_invariants(&a);
    }

    #[test]
    fn config_parses_good_strings() {
        assert_eq!(
            AllocatorConfig::parse("").unwrap(),
            AllocatorConfig::default()
        );
        assert_eq!(
            AllocatorConfig::parse("  ").unwrap(),
            AllocatorConfig::default()
        );
        let c = AllocatorConfig::parse(
            "max_split_size_mb:100, expandable_segments:True,garbage_collection_threshold:0.6,\
             roundup_power2_divisions:[64:8,256:4,1024:4,>:1],",
        )
        .unwrap();
        assert_eq!(c.max_split_size, Some(100 * MIB));
        assert!(c.expandable_segments);
        assert_eq!(c.garbage_collection_threshold, Some(0.6));
        let d = c.roundup_power2_divisions.unwrap();
        assert_eq!(d[..7], [8; 7]);
        assert_eq!(d[7..11], [0, 4, 0, 4]);
        assert_eq!(d[11..], [1; 5]);
        assert_eq!(
            c.not_modelled,
            vec!["garbage_collection_threshold".to_string()]
        );
        let c = AllocatorConfig::parse("max_split_size_mb:20").unwrap();
        assert_eq!(c.max_split_size, Some(20 * MIB));
        let c = AllocatorConfig::parse(
            "backend:native,expandable_segments:False,release_lock_on_cudamalloc:True,\
             pinned_use_cuda_host_register:True,pinned_num_register_threads:8,\
             per_process_memory_fraction:0.5,graph_capture_record_stream_reuse:True",
        )
        .unwrap();
        assert!(!c.expandable_segments);
        assert_eq!(c.per_process_memory_fraction, Some(0.5));
        assert_eq!(c.not_modelled.len(), 5);
        assert_eq!(c.max_non_split_rounding_bytes(), 20 * MIB);
    }

    #[test]
    fn config_rejects_bad_strings() {
        let err = |s: &str| AllocatorConfig::parse(s).unwrap_err();
        assert_eq!(
            err("max_split_size_mb:abc"),
            "PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb:abc is not a number"
        );
        assert!(err("max_split_size_mb:10").contains("must be >= 20"));
        assert!(err("max_split_size_mb:-5").contains("is not a number"));
        assert!(err("expandable_segments:true").contains("True or False"));
        assert!(err("foo:1").contains("unrecognized key 'foo'"));
        assert!(err("garbage_collection_threshold:1.5").contains("(0.0, 1.0)"));
        assert!(err("garbage_collection_threshold:0").contains("(0.0, 1.0)"));
        assert!(err("garbage_collection_threshold:x").contains("is not a number"));
        assert!(err("roundup_power2_divisions:3").contains("power of 2"));
        assert!(err("roundup_power2_divisions:0").contains("power of 2"));
        assert!(err("roundup_power2_divisions:[100:4]").contains("interval 100"));
        assert!(err("roundup_power2_divisions:[64:3]").contains("divisions 3"));
        assert!(err("roundup_power2_divisions:[64:4").contains("']'"));
        assert!(err("backend:cudaMallocAsync").contains("not modelled"));
        assert!(err("backend:other").contains("not a known allocator backend"));
        assert!(err("large_segment_size_mb:10").contains("must be > 10"));
        assert!(err("max_split_size_mb").contains("expected ':'"));
        assert!(err("max_split_size_mb:").contains("missing value"));
        assert!(err("max_split_size_mb:[1:2]").contains("single value"));
        assert!(err("max_split_size_mb:100 expandable_segments:True").contains("expected ','"));
        assert!(err("max_split_size_mb:12abc").contains("is not a number"));
        assert!(err("expandable_segments:True:False").contains("expected ','"));
        assert!(err("per_process_memory_fraction:2").contains("[0.0, 1.0]"));
        assert!(err("pinned_num_register_threads:256").contains("at most 128"));
        assert!(err(",").contains("expected a key"));
    }

    /// A long random trace: the bookkeeping stays consistent and freeing
    /// everything returns allocated/requested to zero.
    fn random_trace(conf: &str, events: usize, seed: u64) {
        let mut a = alloc_with(conf);
        let mut state = seed;
        let mut rand = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            state >> 33
        };
        let mut live: Vec<u64> = Vec::new();
        let mut next_id = 0u64;
        for step in 0..events {
            if live.is_empty() || rand() % 100 < 55 {
                let bytes = match rand() % 10 {
                    0..=4 => rand() % (64 * KIB) + 1,
                    5..=6 => rand() % (2 * MIB) + 1,
                    7..=8 => rand() % (24 * MIB) + 1,
                    _ => rand() % (200 * MIB) + 1,
                };
                a.malloc(next_id, bytes);
                live.push(next_id);
                next_id += 1;
            } else {
                let i = (rand() as usize) % live.len();
                let id = live.swap_remove(i);
                a.free(id);
            }
            if step % 5000 == 0 {
                check_invariants(&a);
            }
            if step % 20011 == 0 {
                a.empty_cache();
            }
        }
        check_invariants(&a);
        for id in live {
            a.free(id);
        }
        let s = a.stats();
        assert_eq!((s.allocated, s.requested, s.allocations), (0, 0, 0));
        check_invariants(&a);
        a.empty_cache();
        assert_eq!(a.stats().reserved, 0);
        assert!(a.blocks.is_empty());
        assert_eq!(a.unknown_frees(), 0);
    }

    #[test]
    fn random_traces_keep_invariants() {
        random_trace("", 100_000, 1);
        random_trace("max_split_size_mb:64", 100_000, 2);
        random_trace("expandable_segments:True", 100_000, 3);
        random_trace(
            "roundup_power2_divisions:[64:8,>:2],max_split_size_mb:128",
            50_000,
            4,
        );
    }

    #[test]
    fn a_million_events_run_quickly() {
        let mut a = alloc();
        let start = std::time::Instant::now();
        for i in 0..500_000u64 {
            a.malloc(i, (i % 97 + 1) * 4096 + (i % 7) * 3 * MIB);
            if i >= 64 {
                a.free(i - 64);
            }
        }
        assert!(a.stats().peak_allocated > 0);
        assert!(start.elapsed().as_secs() < 20);
    }
}
