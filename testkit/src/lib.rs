//! Test rig: throwaway PostgreSQL clusters for live tests.
