"""The method: scaling laws, fits, records, the sheet and the verdict. Imports no part."""
