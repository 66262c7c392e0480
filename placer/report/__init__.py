"""Reports: terminal tables now; comparisons, Gantt charts and HTML grow here."""
