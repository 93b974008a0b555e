//! The command's words: what `estimate`, `plan`, `replay` and `diff` print, composed
//! from the library's values. Crate-private: the library hands out estimates, plans and
//! replays as values; this text is the command's, free to change with it.
//!
//! - `commands`: each command's text, whole (the command writes it as it is);
//! - `estimate_text`: estimates and plans as a person reads them (and the `Display` of
//!   [`Plans`](crate::estimate::Plans));
//! - `replay_text`: recorded runs replayed, and a prediction held to a recorded run;
//! - `plan_code`: a plan as the code that carries it out, in tch and in PyTorch;
//! - `sharded_text`: a sharded (FSDP2) estimate's ranks.

pub(crate) mod commands;
pub(crate) mod estimate_text;
pub(crate) mod plan_code;
pub(crate) mod replay_text;
pub(crate) mod sharded_text;
