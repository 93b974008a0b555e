//! `<run>_parameters.csv`'s rows encoded once a set: each variable's and gradient's row
//! from its `parameter` column on, so that a set written again needs only its timestamp,
//! epoch and iteration put in front (`report/csv.rs` writes them).

use crate::format;
use crate::runs::schema::ParameterRow;
use crate::stats::IterationStats;

/// The parameter rows' encoded tails, one after another, and where each ends: a step's
/// rows are copied line by line without scanning every byte for line ends again.
#[derive(Debug, Default)]
pub(super) struct Tails {
    pub(super) bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Tails {
    /// Each row's tail, its line end included.
    pub(super) fn lines(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(a, &b)| &self.bytes[a..b])
    }
}

/// The parameter rows of `s`'s variables (each variable, then its gradient), encoded as
/// the CSV writer encodes a [`ParameterRow`], from the `parameter` column on: one line
/// each.
pub(super) fn parameter_tails(s: &IterationStats) -> csv::Result<Tails> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    for v in s.variables.iter() {
        let mut row = ParameterRow {
            timestamp: String::new(),
            epoch: 0,
            iteration: 0,
            parameter: v.name.clone(),
            kind: v.kind.as_str().to_string(),
            dtype: v.dtype.clone(),
            shape: format::shape(&v.shape),
            bytes: v.bytes,
        };
        w.serialize(&row)?;
        if let Some(g) = v.grad_bytes {
            row.kind = "gradient".to_string();
            row.bytes = g;
            w.serialize(&row)?;
        }
    }
    let rows = w.into_inner().map_err(|e| e.into_error())?;
    // Each line less the empty timestamp and the zero epoch and iteration: `,0,0,`.
    let lead = b",0,0,";
    let mut tails = Tails {
        bytes: Vec::with_capacity(rows.len()),
        ends: Vec::new(),
    };
    for line in rows.split_inclusive(|&b| b == b'\n') {
        let tail = line.strip_prefix(lead).ok_or_else(|| {
            csv::Error::from(std::io::Error::other(
                "a parameter row did not begin with its timestamp, epoch and iteration",
            ))
        })?;
        tails.bytes.extend_from_slice(tail);
        tails.ends.push(tails.bytes.len());
    }
    Ok(tails)
}

/// `<run>_parameters.csv`'s header: [`ParameterRow`]'s fields, as serde names them.
pub(super) fn parameter_header() -> csv::Result<csv::StringRecord> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.serialize(ParameterRow::default())?;
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    let mut r = csv::Reader::from_reader(&bytes[..]);
    Ok(r.headers()?.clone())
}
