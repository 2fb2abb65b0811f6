// The client's `tasks` table as column types, shared by the Node client (lib/schema.mjs)
// and the browser page (web/app.mjs), which build it with their own SDK's classes.

/** Column name → the SDK's column type (`column.text`, `column.integer`). */
export const TASKS_COLUMNS = {
  org_id: 'text',
  project_id: 'text',
  title: 'text',
  status: 'text',
  priority: 'integer',
  assignee_id: 'text',
  story_points: 'integer',
  updated_at: 'text',
  summary: 'text'
};

/** The output tables, in the order they are dumped. */
export const TABLES = ['tasks'];

/** The client schema, built from an SDK's `{ Schema, Table, column }`. */
export function buildSchema({ Schema, Table, column }) {
  const columns = Object.fromEntries(Object.entries(TASKS_COLUMNS).map(([name, type]) => [name, column[type]]));
  return new Schema({ tasks: new Table(columns) });
}
