"""Lightning projects written as Lightning code, run on geartrain after changing their imports only."""
