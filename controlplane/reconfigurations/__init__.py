"""Reconfigurations: ``models`` (the record of each plan applied), ``schemas`` (plans,
helper requests, records), ``service`` (validate, record, progress) and ``routes``
(/jobs/{id}/reconfigurations, /scale, /rebalance, /migrate, /logic)."""
