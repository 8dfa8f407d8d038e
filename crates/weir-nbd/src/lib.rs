//! NBD wire protocol on byte buffers: handshake, options, requests, replies (server and client side)
