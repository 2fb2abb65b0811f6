-- Run on the primary (as a superuser) before pointing powersync_mdbx at it.
-- The primary needs wal_level = logical (postgresql.conf, restart) and free
-- max_replication_slots / max_wal_senders for one slot per sync replica.

-- A role for the sync replica: replication connection plus read access.
CREATE ROLE powersync_replication WITH REPLICATION LOGIN PASSWORD 'change-me';
GRANT SELECT ON ALL TABLES IN SCHEMA public TO powersync_replication;
ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT ON TABLES TO powersync_replication;

-- The publication the PowerSync service and powersync_mdbx read. It must publish
-- insert, update, delete and truncate for every table the sync rules read.
CREATE PUBLICATION powersync FOR ALL TABLES;
-- Sync rules that read a partitioned table by its own name need its partitions' changes
-- published under that name (docs/operations.md, section 2, "Partitioned tables"):
-- ALTER PUBLICATION powersync SET (publish_via_partition_root = true);
