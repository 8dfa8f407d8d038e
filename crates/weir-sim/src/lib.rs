//! Deterministic discrete-event simulator of a storage stack running the weir-qos engine on a virtual clock
