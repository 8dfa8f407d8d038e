//! NBD storage server with the QoS engine in the I/O path
