//! Names of ops and layers: interned ids from the native layer, the layer of a
//! variable path, and the one marker for a missing name.

use std::collections::HashMap;

use crate::ffi;

/// Shown wherever a name is missing: an allocation outside any op, a layer that is
/// not known, a variable at the root of the VarStore, a peak before the first op.
pub const MISSING: &str = "(none)";

/// The layer of a variable path: everything before the last `.` ([`MISSING`] for a
/// variable at the root).
pub(crate) fn layer_of(path: &str) -> String {
    match path.rfind('.') {
        Some(i) => path[..i].to_string(),
        None => MISSING.to_string(),
    }
}

/// Names of interned ids, looked up once each; [`MISSING`] for ids without a name
/// (-1: no op, no layer).
#[derive(Default)]
pub(crate) struct Names(HashMap<i32, String>);

impl Names {
    pub(crate) fn get(&mut self, id: i32) -> String {
        if id < 0 {
            return MISSING.into();
        }
        self.0
            .entry(id)
            .or_insert_with(|| {
                ffi::name(id)
                    .ok()
                    .flatten()
                    .filter(|n| !n.is_empty())
                    .unwrap_or_else(|| MISSING.into())
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_is_the_path_without_its_last_component() {
        assert_eq!(layer_of("layer1.0.conv1.weight"), "layer1.0.conv1");
        assert_eq!(layer_of("weight"), MISSING);
    }

    #[test]
    fn missing_ids_are_the_missing_marker() {
        assert_eq!(Names::default().get(-1), MISSING);
    }
}
