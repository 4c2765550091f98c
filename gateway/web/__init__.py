"""Browser accounts and the team console: users, sessions, CSRF, emails and /console pages."""
