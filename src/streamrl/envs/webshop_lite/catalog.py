"""The generated catalogue: product types over WebShop's five categories, and products built from them.

Every product has WebShop's item schema (``asin``, ``Title``, ``category``, ``query``, ``name``,
``product_category``, ``pricing``, ``price``, ``options``, ``Attributes``, ``BulletPoints``,
``Description``, ``Reviews``, ``Rating``). Generation is a pure function of the seed.

The vocabularies are chosen so that WebShop's matching rules discriminate: within one option
group no two values fuzzy-match each other (``token_set_ratio <= 85``), no attribute of a
subcategory fuzzy-matches another, and a product's text (title, bullet points, description)
never contains any option value, so an option only counts when it was clicked, as in WebShop.
Near-duplicates exist by construction: every type has dozens of products that differ in
attributes, options and price.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

DEFAULT_SEED = 0
PRODUCTS_PER_TYPE = 30

# color normalisation is identity: every colour below is already a base name
SHIRT_COLORS = ("black", "white", "navy blue", "heather grey", "olive green", "burgundy", "khaki", "mustard yellow")
CLOTHING_SIZES = ("small", "medium", "large", "x-large", "xx-large")
SHOE_SIZES = ("6", "7", "7.5", "8", "8.5", "9", "10", "11")
SHOE_COLORS = ("black", "white", "brown", "grey", "navy blue", "beige")
METAL_COLORS = ("gold", "silver", "copper", "black", "white")
MAKEUP_COLORS = ("nude", "coral", "plum", "mauve", "berry", "caramel", "crimson")
SKIN_SIZES = ("1 fl oz", "1.7 fl oz", "3.4 fl oz", "6.8 fl oz")
SCENTS = ("unscented", "lavender", "citrus", "cucumber", "coconut", "eucalyptus")
TECH_COLORS = ("black", "white", "silver", "space gray", "red", "green")
PACKS = ("1 pack", "2 pack", "3 pack", "4 pack")
CABLE_SIZES = ("3 feet", "6 feet", "10 feet", "15 feet")
WOOD_COLORS = ("espresso", "walnut", "white", "black", "natural", "grey wash")
FURNITURE_SIZES = ("24 inch", "32 inch", "40 inch", "48 inch")
TEXTILE_COLORS = ("ivory", "charcoal", "sage green", "dusty pink", "navy blue", "beige")
TEXTILE_SIZES = ("20x30 inch", "60x72 inch", "5x7 feet", "8x10 feet")
SNACK_FLAVORS = ("chocolate", "peanut butter", "sea salt", "barbecue", "honey", "vanilla", "cinnamon", "sour cream")
COUNTS = ("6 count", "12 count", "30 count", "48 count")
DRINK_FLAVORS = ("original", "mango", "lemon", "mint", "raspberry", "caramel")
OUNCES = ("8 ounce", "16 ounce", "32 ounce", "64 ounce")


@dataclass(frozen=True)
class Subcategory:
    category: str  # one of WebShop's five: fashion, makeup, electronics, furniture, food
    breadcrumb: tuple[str, ...]  # the product_category levels above the type
    types: tuple[str, ...]
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)
    price: tuple[float, float] = (10.0, 60.0)


SUBCATEGORIES: tuple[Subcategory, ...] = (
    Subcategory(
        "fashion", ("Clothing, Shoes & Jewelry", "Men", "Clothing"),
        ("men's t-shirt", "men's dress shirt", "men's jeans", "men's shorts", "men's hoodie", "men's jacket",
         "men's sweatpants", "men's polo shirt"),
        ("machine washable", "slim fit", "relaxed fit", "button closure", "long sleeve", "short sleeve",
         "quick drying", "moisture wicking", "cotton spandex", "drawstring closure"),
        {"color": SHIRT_COLORS, "size": CLOTHING_SIZES}, (12.0, 70.0)),
    Subcategory(
        "fashion", ("Clothing, Shoes & Jewelry", "Women", "Clothing"),
        ("women's dress", "women's blouse", "women's leggings", "women's cardigan", "women's skirt",
         "women's tank top", "women's jumpsuit", "women's pajama set"),
        ("machine washable", "high waist", "elastic waistband", "hand wash", "loose fit", "tummy control",
         "soft material", "wide leg", "v neck"),
        {"color": SHIRT_COLORS, "size": CLOTHING_SIZES}, (12.0, 80.0)),
    Subcategory(
        "fashion", ("Clothing, Shoes & Jewelry", "Shoes"),
        ("running shoe", "walking shoe", "hiking boot", "ankle boot", "house slipper", "flip flop sandal",
         "penny loafer", "canvas sneaker"),
        ("non slip", "rubber sole", "lace up", "memory foam", "arch support", "breathable mesh",
         "slip resistant sole", "lightweight design"),
        {"color": SHOE_COLORS, "size": SHOE_SIZES}, (18.0, 120.0)),
    Subcategory(
        "fashion", ("Clothing, Shoes & Jewelry", "Jewelry"),
        ("pendant necklace", "charm bracelet", "stud earrings", "wrist watch", "stacking ring", "anklet chain"),
        ("stainless steel", "gift box", "hypoallergenic", "tarnish free", "adjustable length", "water resistant",
         "nickel free"),
        {"color": METAL_COLORS}, (9.0, 90.0)),
    Subcategory(
        "makeup", ("Beauty & Personal Care", "Makeup"),
        ("lipstick", "eyeliner", "mascara", "liquid foundation", "concealer", "eyeshadow palette", "lip gloss",
         "blush compact"),
        ("long lasting", "cruelty free", "paraben free", "waterproof formula", "easy carry", "natural ingredients",
         "highly pigmented", "vegan formula"),
        {"color": MAKEUP_COLORS}, (5.0, 45.0)),
    Subcategory(
        "makeup", ("Beauty & Personal Care", "Skin Care"),
        ("face moisturizer", "face serum", "mineral sunscreen", "foaming cleanser", "sheet mask", "eye cream",
         "body lotion", "lip balm"),
        ("fragrance free", "paraben free", "cruelty free", "sensitive skin", "hyaluronic acid", "oil free",
         "dermatologist tested", "anti aging"),
        {"size": SKIN_SIZES, "scent": SCENTS}, (6.0, 60.0)),
    Subcategory(
        "makeup", ("Beauty & Personal Care", "Hair Care"),
        ("shampoo", "conditioner", "hair oil", "hair mask", "dry shampoo", "detangling brush", "curl cream"),
        ("sulfate free", "dry hair", "color safe", "natural ingredients", "cruelty free", "silicone free",
         "damaged hair"),
        {"size": SKIN_SIZES, "scent": SCENTS}, (6.0, 40.0)),
    Subcategory(
        "electronics", ("Electronics", "Headphones"),
        ("wireless earbuds", "over-ear headphones", "gaming headset", "sports earphones", "bone conduction headphones",
         "kids headphones"),
        ("noise cancelling", "bluetooth connection", "long battery life", "fast charging", "sweat resistant",
         "hands free", "built-in microphone", "foldable design"),
        {"color": TECH_COLORS}, (15.0, 150.0)),
    Subcategory(
        "electronics", ("Electronics", "Computers & Accessories"),
        ("wireless mouse", "mechanical keyboard", "usb hub", "laptop stand", "webcam", "monitor arm", "mouse pad",
         "laptop sleeve"),
        ("plug and play", "high speed", "ergonomic design", "easy install", "aluminum alloy", "rgb backlit",
         "compact size", "heavy duty"),
        {"color": TECH_COLORS, "count": PACKS}, (9.0, 110.0)),
    Subcategory(
        "electronics", ("Electronics", "Cell Phones & Accessories"),
        ("phone case", "screen protector", "wall charger", "charging cable", "power bank", "car phone mount",
         "wireless charging pad"),
        ("fast charging", "shockproof", "easy install", "high definition", "scratch resistant", "compact size",
         "bubble free"),
        {"color": TECH_COLORS, "count": PACKS}, (6.0, 60.0)),
    Subcategory(
        "electronics", ("Electronics", "Home Audio & Video"),
        ("bluetooth speaker", "soundbar", "tv wall mount", "hdmi cable", "streaming remote", "projector screen"),
        ("high definition", "easy install", "heavy duty", "surround sound", "waterproof design", "gold plated",
         "universal fit"),
        {"color": TECH_COLORS, "size": CABLE_SIZES}, (10.0, 160.0)),
    Subcategory(
        "furniture", ("Home & Kitchen", "Furniture", "Living Room Furniture"),
        ("coffee table", "tv stand", "bookshelf", "accent chair", "loveseat sofa", "side table", "storage ottoman",
         "console table"),
        ("easy assemble", "solid wood", "storage space", "mid century", "living room", "space saving",
         "metal frame", "tempered glass"),
        {"color": WOOD_COLORS, "size": FURNITURE_SIZES}, (35.0, 320.0)),
    Subcategory(
        "furniture", ("Home & Kitchen", "Furniture", "Bedroom Furniture"),
        ("nightstand", "dresser", "platform bed frame", "upholstered headboard", "wardrobe closet", "vanity desk",
         "storage bench"),
        ("easy assemble", "solid wood", "storage space", "noise free", "metal frame", "soft close drawers",
         "bedroom furniture"),
        {"color": WOOD_COLORS, "size": FURNITURE_SIZES}, (40.0, 380.0)),
    Subcategory(
        "furniture", ("Home & Kitchen", "Furniture", "Home Office Furniture"),
        ("office chair", "standing desk", "computer desk", "filing cabinet", "desk shelf", "footrest"),
        ("lumbar support", "height adjustable", "easy assemble", "high back", "heavy duty", "lockable wheels",
         "cable management"),
        {"color": WOOD_COLORS, "size": FURNITURE_SIZES}, (30.0, 300.0)),
    Subcategory(
        "furniture", ("Home & Kitchen", "Home Decor"),
        ("bath towel set", "shower curtain", "throw pillow cover", "area rug", "blackout curtain", "bath mat",
         "throw blanket"),
        ("machine washable", "non slip", "easy clean", "super soft", "quick drying", "living room",
         "fade resistant"),
        {"color": TEXTILE_COLORS, "size": TEXTILE_SIZES}, (12.0, 140.0)),
    Subcategory(
        "food", ("Grocery & Gourmet Food", "Snacks"),
        ("snack bar", "protein bar", "potato chips", "trail mix", "beef jerky", "popcorn", "crackers",
         "cookies"),
        ("gluten free", "low calorie", "high protein", "non gmo", "keto friendly", "sugar free",
         "individually wrapped", "low carb"),
        {"flavor name": SNACK_FLAVORS, "count": COUNTS}, (4.0, 45.0)),
    Subcategory(
        "food", ("Grocery & Gourmet Food", "Beverages"),
        ("ground coffee", "green tea", "herbal tea", "sparkling water", "energy drink", "hot cocoa mix",
         "coconut water"),
        ("caffeine free", "usda organic", "sugar free", "non gmo", "zero calorie", "fair trade", "gluten free"),
        {"flavor name": DRINK_FLAVORS, "count": COUNTS}, (5.0, 50.0)),
    Subcategory(
        "food", ("Grocery & Gourmet Food", "Pantry Staples"),
        ("pasta sauce", "olive oil", "maple syrup", "spice blend", "basmati rice", "granola", "almond butter"),
        ("usda organic", "gluten free", "non gmo", "kosher certified", "no sugar added", "plant based",
         "low sodium"),
        {"flavor name": DRINK_FLAVORS, "size": OUNCES}, (4.0, 40.0)),
)

CATEGORIES = ("fashion", "makeup", "electronics", "furniture", "food")

_BRAND_START = ("bel", "cor", "dav", "el", "fen", "gal", "hol", "iv", "jun", "kel", "lum", "mar", "nov", "or",
                "pel", "quin", "ros", "sol", "tav", "ul", "ven", "wil", "xan", "yor", "zel")
_BRAND_END = ("ara", "ix", "ona", "ett", "ley", "ora", "um", "ano", "ice", "ova", "ind", "esk")

_FEATURE_TEMPLATES = (
    "{Attr}: designed to be {attr}, so your {type} keeps up with daily use",
    "{Attr} - every {type} is checked by hand before it ships",
    "{Attr}: a thoughtful detail that makes this {type} a favourite",
)
_DESCRIPTION_TEMPLATES = (
    "This {type} from {brand} is made for everyday comfort and easy care. {extra}",
    "Meet the {brand} {type}: simple, dependable and good looking. {extra}",
    "A {type} you can rely on. {brand} pairs honest materials with careful finishing. {extra}",
)
_EXTRA = (
    "It arrives ready to use.",
    "Customer service is happy to help with any question.",
    "A great gift for friends and family.",
    "Backed by a hassle free return policy.",
)
_REVIEW_TITLES = ("Great value", "Works as described", "Pretty good", "Not bad", "Love it", "Would buy again")
_REVIEW_BODIES = (
    "Exactly what I was looking for.",
    "Good quality for the price.",
    "Shipping was quick and the packaging was neat.",
    "Does the job, nothing fancy.",
    "My second one, still happy with it.",
)


def _title_case(text: str) -> str:
    return " ".join(word[:1].upper() + word[1:] for word in text.split())


def _asin(rng: random.Random, used: set[str]) -> str:
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    while True:
        asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
        if asin not in used:
            used.add(asin)
            return asin


def product_text(product: dict[str, Any]) -> str:
    """Title, bullet points and description, lowercased: where WebShop's reward looks for words."""
    return " ".join([product["Title"], " ".join(product["BulletPoints"]), product["Description"]]).lower()


def _make_product(sub: Subcategory, type_name: str, rng: random.Random, used: set[str]) -> dict[str, Any]:
    attributes = sorted(rng.sample(sub.attributes, rng.randint(2, 4)))
    options: dict[str, list[str]] = {}
    for name in sorted(sub.options):
        values = sub.options[name]
        chosen = rng.sample(range(len(values)), rng.randint(2, min(5, len(values))))
        options[name] = [values[i] for i in sorted(chosen)]
    option_values = [v for values in options.values() for v in values]
    for _ in range(100):  # a brand whose letters spell no option value (WebShop matches substrings)
        brand = _title_case(rng.choice(_BRAND_START) + rng.choice(_BRAND_END))
        shown = sorted(rng.sample(attributes, rng.randint(1, min(2, len(attributes)))))
        title = f"{brand} {_title_case(type_name)}, " + ", ".join(_title_case(a) for a in shown)
        bullets = [
            rng.choice(_FEATURE_TEMPLATES).format(Attr=_title_case(a), attr=a, type=type_name) for a in attributes
        ]
        description = rng.choice(_DESCRIPTION_TEMPLATES).format(type=type_name, brand=brand, extra=rng.choice(_EXTRA))
        draft = {"Title": title, "BulletPoints": bullets, "Description": description}
        text = product_text(draft)
        if not any(value in text for value in option_values):
            break
    else:  # pragma: no cover - the vocabularies make this unreachable
        raise RuntimeError(f"webshop_lite: cannot write text free of option values for {type_name}")
    low, high = sub.price
    price = round(rng.uniform(low, high), 2)
    pricing = [price] if rng.random() < 0.7 else [price, round(price * rng.uniform(1.1, 1.6), 2)]
    reviews = [
        {"title": rng.choice(_REVIEW_TITLES), "score": rng.randint(3, 5), "body": rng.choice(_REVIEW_BODIES)}
        for _ in range(rng.randint(1, 3))
    ]
    return {
        "asin": _asin(rng, used),
        "Title": title,
        "name": title,
        "brand": brand,
        "category": sub.category,
        "query": type_name,
        "product_type": type_name,
        "product_category": " › ".join((*sub.breadcrumb, _title_case(type_name))),
        "pricing": pricing,
        "price": price,  # what the item page shows and the purchase costs (WebShop samples it once)
        "options": options,
        "Attributes": attributes,
        "BulletPoints": bullets,
        "Description": description,
        "Reviews": reviews,
        "Rating": "N.A.",
    }


@dataclass(frozen=True)
class Catalog:
    seed: int
    products: tuple[dict[str, Any], ...]
    by_asin: dict[str, dict[str, Any]]

    def digest(self) -> str:
        """A hash of the whole catalogue, for determinism checks."""
        h = hashlib.sha256()
        for p in self.products:
            h.update(repr(sorted(p.items())).encode())
        return h.hexdigest()


@lru_cache(maxsize=4)
def build_catalog(seed: int = DEFAULT_SEED, per_type: int = PRODUCTS_PER_TYPE) -> Catalog:
    """The catalogue of ``seed``: ``per_type`` products of every type, in a seeded shuffled order."""
    rng = random.Random(f"webshop_lite/catalog/{seed}")
    used: set[str] = set()
    products = [
        _make_product(sub, type_name, rng, used)
        for sub in SUBCATEGORIES
        for type_name in sub.types
        for _ in range(per_type)
    ]
    rng.shuffle(products)
    return Catalog(seed, tuple(products), {p["asin"]: p for p in products})
