// The client schema for the fixture's rules (fixture/sync-config.yaml and
// fixture/sync-rules-legacy.yaml): every stream and bucket definition selects the same
// columns of `tasks` into the output table `tasks`.
import { Schema, Table, column } from '@powersync/node';

const tasks = new Table({
  org_id: column.text,
  project_id: column.text,
  title: column.text,
  status: column.text,
  priority: column.integer,
  assignee_id: column.text,
  story_points: column.integer,
  updated_at: column.text,
  summary: column.text
});

export const schema = new Schema({ tasks });

/** The output tables, in the order they are dumped. */
export const TABLES = ['tasks'];

/**
 * Values `uploadData` supplies for NOT NULL columns of the primary that the rules do not
 * sync (so the client cannot hold them) when a local insert creates a row.
 */
export function SERVER_DEFAULTS(user) {
  return { tasks: { owner_id: user ?? 'e2e-client' } };
}
