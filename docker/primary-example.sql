-- The example schema of docker-compose.yml's primary (after sql/primary-setup.sql).
CREATE TABLE todos (
  id text PRIMARY KEY,
  owner_id text NOT NULL,
  description text,
  completed boolean NOT NULL DEFAULT false
);
GRANT SELECT ON todos TO powersync_replication;
