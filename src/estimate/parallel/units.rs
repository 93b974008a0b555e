//! FSDP2's units: the modules wrapped by `fully_shard`, found or named by a pattern.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// The units: module paths, each a unit, from `pattern` or found (the outermost
/// modules of repeated module lists). Every variable outside them is the root's.
pub(crate) fn units(names: &[&str], pattern: Option<&str>) -> Result<Vec<String>> {
    let mut modules: Vec<String> = Vec::new();
    for n in names {
        let comps: Vec<&str> = n.split('.').collect();
        for i in 1..comps.len() {
            let m = comps[..i].join(".");
            if !modules.contains(&m) {
                modules.push(m);
            }
        }
    }
    let chosen: Vec<String> = match pattern {
        Some(p) => {
            let pc: Vec<&str> = p.split('.').collect();
            modules
                .iter()
                .filter(|m| {
                    let mc: Vec<&str> = m.split('.').collect();
                    mc.len() == pc.len() && mc.iter().zip(&pc).all(|(m, p)| glob(p, m))
                })
                .cloned()
                .collect()
        }
        None => {
            // A module list: two or more children of one module whose names are one
            // word and a number (`h.0`, `h.1`; `encoder_layer_0`, `encoder_layer_1`;
            // `layer1`, `layer2`).
            let numbered = |m: &str| -> Option<(String, String)> {
                let (list, last) = m.rsplit_once('.').unwrap_or(("", m));
                let word = last.trim_end_matches(|c: char| c.is_ascii_digit());
                (word.len() < last.len()).then(|| (list.to_string(), word.to_string()))
            };
            let mut lists: HashMap<(String, String), usize> = HashMap::new();
            for m in &modules {
                if let Some(k) = numbered(m) {
                    *lists.entry(k).or_default() += 1;
                }
            }
            modules
                .iter()
                .filter(|m| numbered(m).is_some_and(|k| lists[&k] >= 2))
                .cloned()
                .collect()
        }
    };
    // The outermost only: a unit inside another is part of it.
    let outer: Vec<String> = chosen
        .iter()
        .filter(|m| {
            !chosen
                .iter()
                .any(|o| o != *m && m.starts_with(&format!("{o}.")))
        })
        .cloned()
        .collect();
    if let Some(p) = pattern {
        if outer.is_empty() {
            return Err(Error::InvalidInput {
                name: "fsdp-units",
                value: p.to_string(),
                reason: "no module of the model matches it (`*` stands for one path \
                         component or part of one, as in transformer.h.*)"
                    .into(),
            });
        }
    }
    Ok(outer)
}

/// `*` matches any run of characters of one component.
fn glob(pattern: &str, s: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == s,
        Some((head, tail)) => {
            let Some(rest) = s.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|&i| rest.is_char_boundary(i))
                .any(|i| glob(tail, &rest[i..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_the_outermost_numbered_modules_or_a_pattern() {
        let names = [
            "transformer.wte.weight",
            "transformer.h.0.attn.c_attn.weight",
            "transformer.h.0.mlp.layers.0.weight",
            "transformer.h.0.mlp.layers.1.weight",
            "transformer.h.1.attn.c_attn.weight",
            "transformer.ln_f.weight",
        ];
        assert_eq!(
            units(&names, None).unwrap(),
            ["transformer.h.0", "transformer.h.1"]
        );
        assert_eq!(
            units(&names, Some("transformer.h.*.attn")).unwrap(),
            ["transformer.h.0.attn", "transformer.h.1.attn"]
        );
        // torchvision's names: the encoder's layers, not the MLP's numbered linears.
        let vit = [
            "conv_proj.weight",
            "encoder.layers.encoder_layer_0.mlp.0.weight",
            "encoder.layers.encoder_layer_0.mlp.3.weight",
            "encoder.layers.encoder_layer_1.mlp.0.weight",
            "encoder.layers.encoder_layer_1.mlp.3.weight",
            "heads.head.weight",
        ];
        assert_eq!(
            units(&vit, None).unwrap(),
            [
                "encoder.layers.encoder_layer_0",
                "encoder.layers.encoder_layer_1"
            ]
        );
        // A model without a module list: no unit but the root.
        assert!(units(&["fc.weight", "fc.bias"], None).unwrap().is_empty());
        let e = units(&names, Some("model.layers.*"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("model.layers.*"), "{e}");
        assert!(glob("layer*", "layer12") && !glob("layer*", "conv1") && glob("*", "x"));
    }
}
