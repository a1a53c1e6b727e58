"""The fracgpu command line (serve, admit, demo), its review client and throwaway CA."""
