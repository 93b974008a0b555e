//! A pickle read as data, the way Python reads it: every object the stream shares (a
//! frames list that a block and its history entry both hold, a string written once and
//! referred back to) is one object, referred to as often as the stream refers to it.
//! PyTorch's memory snapshots share their frames lists so: `serde-pickle`'s reader, which
//! counts references to free its memo early, refused those files ("recursive structure
//! found") once an object shared inside another shared one was visited twice.
//!
//! Objects live in arenas and a [`Value`] is 16 bytes that name one: the stream's memo is
//! a table of values, so a reference back costs no copy. A dict is a range of one flat
//! arena of pairs, its key the index of its string (24 bytes a pair, no allocation of its
//! own): a history's millions of entries take about 2.6 times the file's bytes. Only data is read: a pickle
//! that names a class or calls one (GLOBAL, REDUCE, BUILD, ...) is refused, no code
//! runs.

/// A value: a scalar, or an index into its [`Pickle`]'s arenas.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer beyond 64 bits (its value is not kept).
    BigInt,
    Float(f64),
    Str(u32),
    Bytes(u32),
    List(u32),
    Tuple(u32),
    Dict(u32),
    /// A set or frozenset (its items are not kept).
    Set,
}

/// A whole pickle: its objects and its top value.
pub(crate) struct Pickle {
    strs: Vec<Box<str>>,
    bytes: Vec<Box<[u8]>>,
    lists: Vec<Vec<Value>>,
    /// Every dict's pairs, each dict a range of them ([`Pickle::ranges`]): a key is the
    /// index of its string in `strs`, or [`OTHER_KEY`] and an index into `other_keys`.
    pairs: Vec<(u32, Value)>,
    /// Each dict's (start, length) in `pairs`.
    ranges: Vec<(u32, u32)>,
    /// Keys that are not strings.
    other_keys: Vec<Value>,
    root: Value,
}

/// Where the stack holds a MARK.
#[derive(Clone, Copy)]
enum Slot {
    Mark,
    V(Value),
}

/// The stream, read as it comes (the file's bytes are never held whole: a snapshot's
/// objects take a few times its size already).
struct Reader<'a> {
    src: &'a mut dyn std::io::BufRead,
    at: usize,
    /// The bytes of the last `take` or `line`.
    buf: Vec<u8>,
}

/// The stream ended inside an opcode.
const TRUNCATED: &str = "the file ends inside an opcode";

impl Reader<'_> {
    fn fill(&mut self) -> Result<&[u8], String> {
        let at = self.at;
        self.src
            .fill_buf()
            .map_err(|e| format!("the file could not be read at byte {at}: {e}"))
    }
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        self.buf.clear();
        while self.buf.len() < n {
            let at = self.at;
            let avail = self
                .src
                .fill_buf()
                .map_err(|e| format!("the file could not be read at byte {at}: {e}"))?;
            if avail.is_empty() {
                return Err(format!("{TRUNCATED} at byte {} (truncated?)", self.at));
            }
            let k = avail.len().min(n - self.buf.len());
            self.buf.extend_from_slice(&avail[..k]);
            self.src.consume(k);
        }
        self.at += n;
        Ok(&self.buf)
    }
    fn u8(&mut self) -> Result<u8, String> {
        let Some(&b) = self.fill()?.first() else {
            return Err(format!("{TRUNCATED} at byte {} (truncated?)", self.at));
        };
        self.src.consume(1);
        self.at += 1;
        Ok(b)
    }
    fn le(&mut self, n: usize) -> Result<u64, String> {
        let b = self.take(n)?;
        Ok(b.iter().rev().fold(0u64, |a, &x| (a << 8) | u64::from(x)))
    }
    fn line(&mut self) -> Result<&str, String> {
        self.buf.clear();
        let at = self.at;
        let n = self
            .src
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| format!("the file could not be read at byte {at}: {e}"))?;
        if self.buf.last() != Some(&b'\n') {
            return Err(format!("{TRUNCATED} at byte {at}"));
        }
        self.at += n;
        let s = std::str::from_utf8(&self.buf[..n - 1]).map_err(|_| bad(at, "a text line"))?;
        Ok(s.trim_end_matches('\r'))
    }
}

/// A value that is not valid where it is.
fn bad(at: usize, what: &str) -> String {
    format!("{what} that is not valid at byte {at}")
}

impl Pickle {
    /// Reads a pickle (protocols 0 to 5) of dicts, lists, tuples, strings, bytes,
    /// numbers, booleans and None; refuses anything else in one line naming it.
    #[cfg(test)]
    pub(crate) fn parse(mut data: &[u8]) -> Result<Pickle, String> {
        Pickle::read(&mut data)
    }

    /// [`parse`](Self::parse) of a stream, read as it comes.
    pub(crate) fn read(src: &mut dyn std::io::BufRead) -> Result<Pickle, String> {
        let mut p = Pickle {
            strs: Vec::new(),
            bytes: Vec::new(),
            lists: Vec::new(),
            pairs: Vec::new(),
            ranges: Vec::new(),
            other_keys: Vec::new(),
            root: Value::None,
        };
        let mut r = Reader {
            src,
            at: 0,
            buf: Vec::new(),
        };
        let mut stack: Vec<Slot> = Vec::new();
        let mut memo: Vec<Value> = Vec::new();
        let mut memo_sparse: std::collections::HashMap<u64, Value> = Default::default();
        loop {
            let at = r.at;
            let op = r.u8().map_err(|e| {
                if e.starts_with(TRUNCATED) {
                    "the file ends before the pickle's STOP (truncated?)".to_string()
                } else {
                    e
                }
            })?;
            let pop = |stack: &mut Vec<Slot>| -> Result<Value, String> {
                match stack.pop() {
                    Some(Slot::V(v)) => Ok(v),
                    _ => Err(format!("a malformed stream at byte {at} (an empty stack)")),
                }
            };
            let mark = |stack: &mut Vec<Slot>| -> Result<Vec<Value>, String> {
                let Some(k) = stack.iter().rposition(|s| matches!(s, Slot::Mark)) else {
                    return Err(format!("a malformed stream at byte {at} (no mark)"));
                };
                let items = stack[k + 1..]
                    .iter()
                    .map(|s| match s {
                        Slot::V(v) => *v,
                        Slot::Mark => Value::None,
                    })
                    .collect();
                stack.truncate(k);
                Ok(items)
            };
            match op {
                0x80 => {
                    r.u8()?; // PROTO
                }
                0x95 => {
                    r.take(8)?; // FRAME: a length hint
                }
                b'.' => {
                    p.root = pop(&mut stack)?;
                    return Ok(p);
                }
                b'(' => stack.push(Slot::Mark),
                b'0' => {
                    pop(&mut stack)?;
                }
                b'1' => {
                    mark(&mut stack)?;
                }
                b'2' => {
                    let v = pop(&mut stack)?;
                    stack.extend([Slot::V(v), Slot::V(v)]);
                }
                b'N' => stack.push(Slot::V(Value::None)),
                0x88 => stack.push(Slot::V(Value::Bool(true))),
                0x89 => stack.push(Slot::V(Value::Bool(false))),
                b'J' => {
                    let v = r.le(4)? as u32 as i32;
                    stack.push(Slot::V(Value::Int(i64::from(v))));
                }
                b'K' => {
                    let v = r.u8()?;
                    stack.push(Slot::V(Value::Int(i64::from(v))));
                }
                b'M' => {
                    let v = r.le(2)?;
                    stack.push(Slot::V(Value::Int(v as i64)));
                }
                0x8a | 0x8b => {
                    let n = if op == 0x8a {
                        r.u8()? as usize
                    } else {
                        r.le(4)? as usize
                    };
                    let b = r.take(n)?;
                    stack.push(Slot::V(long(b)));
                }
                b'I' | b'L' => {
                    let line = r.line()?;
                    let text = line.trim_end_matches('L');
                    let v = match text {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        _ => text.parse().map(Value::Int).unwrap_or(Value::BigInt),
                    };
                    stack.push(Slot::V(v));
                }
                b'G' => {
                    let b = r.take(8)?;
                    stack.push(Slot::V(Value::Float(f64::from_be_bytes(
                        b.try_into().expect("8 bytes"),
                    ))));
                }
                b'F' => {
                    let line = r.line()?;
                    let v = line.parse().map_err(|_| bad(at, "a float"))?;
                    stack.push(Slot::V(Value::Float(v)));
                }
                0x8c | b'X' | 0x8d => {
                    let n = match op {
                        0x8c => r.u8()? as usize,
                        b'X' => r.le(4)? as usize,
                        _ => r.le(8)? as usize,
                    };
                    let b = r.take(n)?;
                    let s = std::str::from_utf8(b).map_err(|_| bad(at, "a string"))?;
                    stack.push(Slot::V(p.str(s)));
                }
                b'V' => {
                    let line = r.line()?;
                    stack.push(Slot::V(p.str(line)));
                }
                b'U' | b'T' | b'C' | b'B' | 0x8e => {
                    let n = match op {
                        b'U' | b'C' => r.u8()? as usize,
                        b'T' | b'B' => r.le(4)? as usize,
                        _ => r.le(8)? as usize,
                    };
                    let b = r.take(n)?;
                    p.bytes.push(b.into());
                    stack.push(Slot::V(Value::Bytes(p.bytes.len() as u32 - 1)));
                }
                b']' => stack.push(Slot::V(p.list(Vec::new(), false))),
                b')' => stack.push(Slot::V(p.list(Vec::new(), true))),
                b'l' => {
                    let items = mark(&mut stack)?;
                    stack.push(Slot::V(p.list(items, false)));
                }
                b't' => {
                    let items = mark(&mut stack)?;
                    stack.push(Slot::V(p.list(items, true)));
                }
                0x85..=0x87 => {
                    let n = usize::from(op - 0x84);
                    let mut items = vec![Value::None; n];
                    for i in (0..n).rev() {
                        items[i] = pop(&mut stack)?;
                    }
                    stack.push(Slot::V(p.list(items, true)));
                }
                b'a' => {
                    let v = pop(&mut stack)?;
                    p.list_mut(stack.last(), at)?.push(v);
                }
                b'e' => {
                    let items = mark(&mut stack)?;
                    p.list_mut(stack.last(), at)?.extend(items);
                }
                b'}' => stack.push(Slot::V(p.dict(Vec::new())?)),
                b'd' => {
                    let items = mark(&mut stack)?;
                    let pairs = pairs(&items, at)?;
                    stack.push(Slot::V(p.dict(pairs)?));
                }
                b's' => {
                    let v = pop(&mut stack)?;
                    let k = pop(&mut stack)?;
                    p.dict_extend(stack.last(), at, vec![(k, v)])?;
                }
                b'u' => {
                    let items = mark(&mut stack)?;
                    let pairs = pairs(&items, at)?;
                    p.dict_extend(stack.last(), at, pairs)?;
                }
                0x8f => stack.push(Slot::V(Value::Set)),
                0x90 => {
                    mark(&mut stack)?;
                }
                0x91 => {
                    mark(&mut stack)?;
                    stack.push(Slot::V(Value::Set));
                }
                0x94 => {
                    let v = match stack.last() {
                        Some(Slot::V(v)) => *v,
                        _ => return Err(format!("a malformed stream at byte {at} (memoize)")),
                    };
                    memo.push(v);
                }
                b'p' | b'q' | b'r' => {
                    let id = match op {
                        b'p' => r.line()?.parse().map_err(|_| bad(at, "a memo index"))?,
                        b'q' => u64::from(r.u8()?),
                        _ => r.le(4)?,
                    };
                    let v = match stack.last() {
                        Some(Slot::V(v)) => *v,
                        _ => return Err(format!("a malformed stream at byte {at} (put)")),
                    };
                    if id as usize == memo.len() {
                        memo.push(v);
                    } else if (id as usize) < memo.len() {
                        memo[id as usize] = v;
                    } else {
                        memo_sparse.insert(id, v);
                    }
                }
                b'g' | b'h' | b'j' => {
                    let id = match op {
                        b'g' => r.line()?.parse().map_err(|_| bad(at, "a memo index"))?,
                        b'h' => u64::from(r.u8()?),
                        _ => r.le(4)?,
                    };
                    let v = memo
                        .get(id as usize)
                        .or_else(|| memo_sparse.get(&id))
                        .copied()
                        .ok_or_else(|| {
                            format!("a reference at byte {at} to memo entry {id}, never stored")
                        })?;
                    stack.push(Slot::V(v));
                }
                b'c' | 0x93 | b'R' | b'b' | 0x81 | 0x92 | b'i' | b'o' | 0x82..=0x84 => {
                    return Err(format!(
                        "it names or calls a Python class at byte {at} (opcode 0x{op:02x}); \
                         a memory snapshot is plain data"
                    ));
                }
                _ => {
                    return Err(format!("an unknown opcode 0x{op:02x} at byte {at}"));
                }
            }
        }
    }

    fn str(&mut self, s: &str) -> Value {
        self.strs.push(s.into());
        Value::Str(self.strs.len() as u32 - 1)
    }
    fn list(&mut self, items: Vec<Value>, tuple: bool) -> Value {
        self.lists.push(items);
        let i = self.lists.len() as u32 - 1;
        if tuple {
            Value::Tuple(i)
        } else {
            Value::List(i)
        }
    }
    fn dict(&mut self, pairs: Vec<(Value, Value)>) -> Result<Value, String> {
        let start = self.pairs_len()?;
        self.ranges.push((start, 0));
        let i = self.ranges.len() as u32 - 1;
        self.append_pairs(i, pairs)?;
        Ok(Value::Dict(i))
    }
    fn pairs_len(&self) -> Result<u32, String> {
        u32::try_from(self.pairs.len())
            .map_err(|_| "more than 4 billion dict items: too large a file to read".to_string())
    }
    fn key(&mut self, k: Value) -> u32 {
        match k {
            Value::Str(i) if i < OTHER_KEY => i,
            other => {
                self.other_keys.push(other);
                OTHER_KEY | (self.other_keys.len() as u32 - 1)
            }
        }
    }
    /// Appends to dict `i`: where its pairs are not the arena's last, they move to its end
    /// first (a dict filled in several batches with others made between them; Python's
    /// pickler writes a dict's items in one batch under 1000 of them).
    fn append_pairs(&mut self, i: u32, new: Vec<(Value, Value)>) -> Result<(), String> {
        let (start, len) = self.ranges[i as usize];
        let end = self.pairs_len()?;
        let start = if start + len == end {
            start
        } else {
            self.pairs
                .extend_from_within(start as usize..(start + len) as usize);
            end
        };
        for (k, v) in new {
            let k = self.key(k);
            self.pairs.push((k, v));
        }
        let len = self.pairs_len()? - start;
        self.ranges[i as usize] = (start, len);
        Ok(())
    }
    fn list_mut(&mut self, top: Option<&Slot>, at: usize) -> Result<&mut Vec<Value>, String> {
        match top {
            Some(Slot::V(Value::List(i))) => Ok(&mut self.lists[*i as usize]),
            _ => Err(format!(
                "a malformed stream at byte {at} (append to a non-list)"
            )),
        }
    }
    fn dict_extend(
        &mut self,
        top: Option<&Slot>,
        at: usize,
        pairs: Vec<(Value, Value)>,
    ) -> Result<(), String> {
        match top {
            Some(Slot::V(Value::Dict(i))) => self.append_pairs(*i, pairs),
            _ => Err(format!(
                "a malformed stream at byte {at} (set an item of a non-dict)"
            )),
        }
    }

    /// The top value.
    pub(crate) fn root(&self) -> Value {
        self.root
    }

    /// The items of a list or a tuple.
    pub(crate) fn list_of(&self, v: Value) -> Option<&[Value]> {
        match v {
            Value::List(i) | Value::Tuple(i) => Some(&self.lists[i as usize]),
            _ => None,
        }
    }

    /// The value at a string key of a dict (the last one set, as Python keeps it).
    pub(crate) fn get(&self, dict: Value, key: &str) -> Option<Value> {
        let Value::Dict(i) = dict else { return None };
        let (start, len) = self.ranges[i as usize];
        self.pairs[start as usize..(start + len) as usize]
            .iter()
            .rev()
            .find(|(k, _)| *k < OTHER_KEY && &*self.strs[*k as usize] == key)
            .map(|&(_, v)| v)
    }

    /// Whether a value is a dict.
    pub(crate) fn is_dict(&self, v: Value) -> bool {
        matches!(v, Value::Dict(_))
    }

    /// A string's text.
    pub(crate) fn text(&self, v: Value) -> Option<&str> {
        match v {
            Value::Str(i) => Some(&self.strs[i as usize]),
            _ => None,
        }
    }

    /// A non-negative integer.
    pub(crate) fn number(&self, v: Value) -> Option<u64> {
        match v {
            Value::Int(n) => u64::try_from(n).ok(),
            Value::Bool(b) => Some(u64::from(b)),
            _ => None,
        }
    }
}

/// A dict key's mark of a key that is not a string (the rest of the `u32`: its index in
/// the other keys).
const OTHER_KEY: u32 = 1 << 31;

/// A LONG1/LONG4 payload: little-endian two's complement.
fn long(b: &[u8]) -> Value {
    if b.is_empty() {
        return Value::Int(0);
    }
    if b.len() > 8 {
        return Value::BigInt;
    }
    let mut v: u64 = 0;
    for (i, &x) in b.iter().enumerate() {
        v |= u64::from(x) << (8 * i);
    }
    let bits = 8 * b.len() as u32;
    if bits < 64 && b[b.len() - 1] & 0x80 != 0 {
        v |= u64::MAX << bits;
    }
    Value::Int(v as i64)
}

fn pairs(items: &[Value], at: usize) -> Result<Vec<(Value, Value)>, String> {
    if items.len() % 2 != 0 {
        return Err(format!(
            "a malformed stream at byte {at} (a key without a value)"
        ));
    }
    Ok(items.chunks(2).map(|c| (c[0], c[1])).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes Python 3's pickle.dumps wrote (protocol 4) for `[x, x]` with `x = {"a": 1}`:
    /// the dict is written once and referred back to (BINGET 1), its key inside it
    /// memoized too. serde-pickle refused this ("recursive structure found").
    const SHARED: &[u8] =
        b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00]\x94(}\x94\x8c\x01a\x94K\x01sh\x01e.";

    #[test]
    fn a_shared_object_is_read_wherever_it_is_referred_to() {
        let p = Pickle::parse(SHARED).unwrap();
        let items = p.list_of(p.root()).unwrap();
        assert_eq!(items.len(), 2);
        for &d in items {
            assert_eq!(p.get(d, "a").and_then(|v| p.number(v)), Some(1));
        }
    }

    #[test]
    fn integers_of_every_width_read_as_python_reads_them() {
        // LONG1 of 1, 2 and 8 bytes, negative and positive; BININT negative.
        assert_eq!(long(&[0xff]), Value::Int(-1));
        assert_eq!(long(&[0x00, 0x80]), Value::Int(-32768));
        assert_eq!(long(&[0x00, 0x01]), Value::Int(256));
        assert_eq!(
            long(&0x7fff_ffff_ffff_fffe_i64.to_le_bytes()),
            Value::Int(0x7fff_ffff_ffff_fffe)
        );
        assert_eq!(long(&[1; 9]), Value::BigInt);
    }

    #[test]
    fn a_truncated_or_code_calling_pickle_is_refused() {
        let cut = Pickle::parse(&SHARED[..SHARED.len() - 3]).err().unwrap();
        assert!(cut.contains("truncated"), "{cut}");
        // pickle.dumps(collections.OrderedDict()), protocol 2: GLOBAL then REDUCE.
        let class = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01.";
        let e = Pickle::parse(class).err().unwrap();
        assert!(e.contains("names or calls a Python class"), "{e}");
    }
}
