//! Workload models: Iometer access specifications, application profiles (later VDI/OLTP/Exchange)
