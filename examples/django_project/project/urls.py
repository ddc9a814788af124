import os

from django.urls import include, path
from shop import views

from runifold_sync.contrib.django.dashboard import dashboard_urls

urlpatterns = [
    path("orders/", views.create_order),
    path("orders/<int:order_id>/", views.show_order),
    # The operator dashboard (the `dashboard` extra); read-only without the token.
    path("ops/", include(dashboard_urls(token=os.environ.get("RUNIFOLD_DASHBOARD_TOKEN")))),
]
